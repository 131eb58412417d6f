// Compaction: what the loop does, rarely, when the next turn would not fit the model's context.
// Deterministic (same conversation, same result) so it is testable and explainable:
//   - the system prompt and the task (entries 0 and 1) are kept as they are;
//   - the most recent `keep_recent_turns` assistant turns and everything after them are kept;
//   - in older turns each tool output is replaced by a one-line note naming the tool and the
//     size removed; with keep_recent_turns == 0 older reasoning is dropped as well.
// The model then re-prefills once from the first point where the conversation changed.
#pragma once

#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

std::vector<Message> compact_conversation(const std::vector<Message>& conversation, int keep_recent_turns);

// The note that replaces a tool output.
std::string compaction_note(const Message& tool_message);

}  // namespace kiln::agent
