// parse_render_input: the Hugging Face apply_chat_template inputs → Conversation + RenderOptions.
// Content lists are flattened exactly as the template's render_content macro does.
#include "engine/chat/chat_template.h"
#include "engine/chat/python_text.h"

namespace kiln::engine {

namespace {

struct VisionCount {
  int images = 0;
  int videos = 0;
};

// render_content(content, do_vision_count=true): returns false and sets error on bad input.
bool flatten_content(const Json& content, bool is_system, bool add_vision_id, VisionCount& count,
                     std::string& out, std::string& error, const std::string& where) {
  if (content.is_null()) return true;
  if (content.is_string()) {
    out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) {
    error = where + ": Unexpected content type (expected a string, null or a list of parts).";
    return false;
  }
  for (std::size_t i = 0; i < content.size(); ++i) {
    const Json& item = content[i];
    const std::string part = where + "[" + std::to_string(i) + "]";
    if (!item.is_object()) {
      error = part + ": Unexpected item type in content.";
      return false;
    }
    const std::string type = item.contains("type") && item["type"].is_string()
                                 ? item["type"].get<std::string>() : "";
    if (item.contains("image") || item.contains("image_url") || type == "image") {
      if (is_system) {
        error = part + ": System message cannot contain images.";
        return false;
      }
      ++count.images;
      if (add_vision_id) out += "Picture " + std::to_string(count.images) + ": ";
      out += "<|vision_start|><|image_pad|><|vision_end|>";
    } else if (item.contains("video") || type == "video") {
      if (is_system) {
        error = part + ": System message cannot contain videos.";
        return false;
      }
      ++count.videos;
      if (add_vision_id) out += "Video " + std::to_string(count.videos) + ": ";
      out += "<|vision_start|><|video_pad|><|vision_end|>";
    } else if (item.contains("text")) {
      const Json& t = item["text"];
      out += t.is_string() ? t.get<std::string>() : python::str(t);
    } else {
      error = part + ": Unexpected item type in content.";
      return false;
    }
  }
  return true;
}

bool parse_tool_call(const Json& j, ToolCall& call, std::string& error, const std::string& where) {
  if (!j.is_object()) {
    error = where + ": expected an object";
    return false;
  }
  const Json& f = j.contains("function") && j["function"].is_object() ? j["function"] : j;
  if (!f.contains("name") || !f["name"].is_string()) {
    error = where + ".name: expected a string";
    return false;
  }
  call.name = f["name"].get<std::string>();
  if (j.contains("id") && j["id"].is_string()) call.id = j["id"].get<std::string>();
  if (!f.contains("arguments") || f["arguments"].is_null()) return true;
  const Json& args = f["arguments"];
  if (args.is_object()) {
    call.arguments = args;
  } else if (args.is_string()) {
    // OpenAI sends arguments as a JSON string; the template needs the object.
    Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      error = where + ".arguments: a string that is not a JSON object";
      return false;
    }
    call.arguments = std::move(parsed);
  } else {
    error = where + ".arguments: expected an object or a JSON string";
    return false;
  }
  return true;
}

bool read_bool(const Json& input, const char* key, bool& out, std::string& error) {
  if (!input.contains(key) || input[key].is_null()) return true;
  if (!input[key].is_boolean()) {
    error = std::string(key) + ": expected true or false";
    return false;
  }
  out = input[key].get<bool>();
  return true;
}

}  // namespace

ParsedRenderInput parse_render_input(const Json& input, RenderOptions defaults) {
  ParsedRenderInput r;
  r.options = defaults;
  if (!input.is_object()) {
    r.error = "input: expected a JSON object with \"messages\"";
    return r;
  }
  bool add_vision_id = false;
  if (!read_bool(input, "add_generation_prompt", r.options.add_generation_prompt, r.error) ||
      !read_bool(input, "enable_thinking", r.options.enable_thinking, r.error) ||
      !read_bool(input, "preserve_thinking", r.options.preserve_thinking, r.error) ||
      !read_bool(input, "add_vision_id", add_vision_id, r.error))
    return r;
  if (input.contains("tools") && input["tools"].is_array())
    for (const Json& t : input["tools"]) r.conversation.tools.push_back(t);
  if (!input.contains("messages") || !input["messages"].is_array()) {
    r.error = "messages: expected an array";
    return r;
  }
  VisionCount count;
  const Json& msgs = input["messages"];
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      r.error = where + ".role: expected a string";
      return r;
    }
    ChatMessage msg;
    const std::string role = m["role"].get<std::string>();
    if (role == "system") msg.role = Role::system;
    else if (role == "user") msg.role = Role::user;
    else if (role == "assistant") msg.role = Role::assistant;
    else if (role == "tool") msg.role = Role::tool;
    else {
      r.error = where + ".role: Unexpected message role '" + role + "'.";
      return r;
    }
    if (!flatten_content(m.value("content", Json()), msg.role == Role::system, add_vision_id,
                         count, msg.content, r.error, where + ".content"))
      return r;
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      const Json& calls = m["tool_calls"];
      for (std::size_t k = 0; k < calls.size(); ++k) {
        ToolCall call;
        if (!parse_tool_call(calls[k], call, r.error,
                             where + ".tool_calls[" + std::to_string(k) + "]"))
          return r;
        msg.tool_calls.push_back(std::move(call));
      }
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string())
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    r.conversation.messages.push_back(std::move(msg));
  }
  return r;
}

}  // namespace kiln::engine
