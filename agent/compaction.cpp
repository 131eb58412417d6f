#include "agent/compaction.h"

#include <algorithm>

namespace kiln::agent {

std::string compaction_note(const Message& m) {
  auto lines = std::count(m.content.begin(), m.content.end(), '\n') + 1;
  return "[output of " + m.name + " removed to fit the context: " + std::to_string(lines) + " lines, " +
         std::to_string(m.content.size()) + " bytes; run the tool again if you need it]";
}

std::vector<Message> compact_conversation(const std::vector<Message>& conversation, int keep_recent_turns) {
  // Index of the first assistant message that is kept whole.
  size_t keep_from = conversation.size();
  int seen = 0;
  for (size_t i = conversation.size(); i-- > 2;) {
    if (conversation[i].role != Role::assistant) continue;
    if (seen == keep_recent_turns) break;
    ++seen;
    keep_from = i;
  }
  if (keep_recent_turns == 0) keep_from = conversation.size();
  std::vector<Message> out(conversation.begin(), conversation.begin() + std::min<size_t>(2, conversation.size()));
  for (size_t i = 2; i < conversation.size(); ++i) {
    Message m = conversation[i];
    if (i < keep_from) {
      if (m.role == Role::tool) {
        std::string note = compaction_note(m);
        if (note.size() < m.content.size()) m.content = std::move(note);
      } else if (m.role == Role::assistant && keep_recent_turns == 0) {
        m.reasoning.clear();
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace kiln::agent
