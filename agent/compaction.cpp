#include "agent/compaction.h"

#include <algorithm>

namespace kiln::agent {

std::string compaction_note(const Message& m) {
  auto lines = std::count(m.content.begin(), m.content.end(), '\n') + 1;
  return "[output of " + m.name + " removed to fit the context: " + std::to_string(lines) + " lines, " +
         std::to_string(m.content.size()) + " bytes; run the tool again if you need it]";
}

namespace {

// Head and tail of `text` within `limit` bytes, the cut named in the middle.
std::string cut_to(const std::string& text, size_t limit) {
  if (text.size() <= limit) return text;
  const size_t half = limit / 2;
  return text.substr(0, half) + "\n[... " + std::to_string(text.size() - 2 * half) +
         " bytes cut to fit the context ...]\n" + text.substr(text.size() - half);
}

// String arguments longer than this are replaced by a note in old turns at keep_recent_turns == 0
// (the text of a `create` or `str_replace` stays in the file; the call only needs its shape).
constexpr size_t kMaxOldArgumentBytes = 1024;

void shrink_arguments(Json& arguments) {
  if (!arguments.is_object()) return;
  for (auto& [key, value] : arguments.items())
    if (value.is_string() && value.get_ref<const std::string&>().size() > kMaxOldArgumentBytes) {
      std::string note = "[";  // built by appending: `"[" + std::to_string(…)` trips GCC 12's -Wrestrict
      note += std::to_string(value.get_ref<const std::string&>().size());
      note += " bytes removed to fit the context]";
      value = std::move(note);
    }
}

}  // namespace

std::vector<Message> compact_conversation(const std::vector<Message>& conversation, int keep_recent_turns,
                                          size_t unread_limit_bytes) {
  // Index of the first assistant message that is kept whole; with keep_recent_turns == 0, the
  // first entry after the last assistant message: what follows it (its tool results) the model
  // has not read yet, and removing it would only make the model run the same tools again.
  size_t keep_from = conversation.size();
  int seen = 0;
  for (size_t i = conversation.size(); i-- > 2;) {
    if (conversation[i].role != Role::assistant) continue;
    if (keep_recent_turns == 0) {
      keep_from = i + 1;
      break;
    }
    if (seen == keep_recent_turns) break;
    ++seen;
    keep_from = i;
  }
  std::vector<Message> out(conversation.begin(), conversation.begin() + std::min<size_t>(2, conversation.size()));
  for (size_t i = 2; i < conversation.size(); ++i) {
    Message m = conversation[i];
    if (i < keep_from) {
      if (m.role == Role::tool) {
        std::string note = compaction_note(m);
        if (note.size() < m.content.size()) m.content = std::move(note);
      } else if (m.role == Role::assistant && keep_recent_turns == 0) {
        m.reasoning.clear();
        for (ToolCall& call : m.tool_calls) shrink_arguments(call.arguments);
      }
    } else if (keep_recent_turns == 0 && m.role == Role::tool) {
      m.content = cut_to(m.content, unread_limit_bytes);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace kiln::agent
