// Compaction: what the loop does, rarely, when the next turn would not fit the model's context.
// Deterministic (same conversation, same result) so it is testable and explainable:
//   - the system prompt and the task (entries 0 and 1) are kept as they are;
//   - the most recent `keep_recent_turns` assistant turns and everything after them are kept;
//   - in older turns each tool output is replaced by a one-line note naming the tool and the
//     size removed; with keep_recent_turns == 0 older reasoning and long string arguments of
//     older tool calls are dropped as well, while the results of the last assistant turn (not
//     read by the model yet) are kept, cut to head and tail within unread_limit_bytes.
// The model then re-prefills once from the first point where the conversation changed.
#pragma once

#include <cstddef>
#include <limits>
#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

std::vector<Message> compact_conversation(const std::vector<Message>& conversation, int keep_recent_turns,
                                          size_t unread_limit_bytes = std::numeric_limits<size_t>::max());

// The note that replaces a tool output.
std::string compaction_note(const Message& tool_message);

}  // namespace kiln::agent
