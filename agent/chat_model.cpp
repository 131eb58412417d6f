#include "agent/chat_model.h"

namespace kiln::agent {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::system: return "system";
    case Role::user: return "user";
    case Role::assistant: return "assistant";
    case Role::tool: return "tool";
    case Role::exit: return "exit";
  }
  return "unknown";
}

Message make_message(Role role, std::string content) {
  Message m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

Message tool_message(std::string content, std::string tool_call_id, std::string name) {
  Message m = make_message(Role::tool, std::move(content));
  m.tool_call_id = std::move(tool_call_id);
  m.name = std::move(name);
  return m;
}

bool same_for_model(const Message& a, const Message& b) {
  if (a.role != b.role || a.content != b.content || a.reasoning != b.reasoning || a.name != b.name ||
      a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

Json message_to_json(const Message& m) {
  Json j = {{"role", role_name(m.role)}, {"content", m.content}};
  if (!m.reasoning.empty()) j["reasoning"] = m.reasoning;
  if (!m.tool_calls.empty()) {
    Json calls = Json::array();
    for (const auto& c : m.tool_calls) calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
    j["tool_calls"] = calls;
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) j["name"] = m.name;
  return j;
}

}  // namespace kiln::agent
