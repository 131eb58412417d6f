#include "agent/transcript.h"

#include <cassert>

namespace kiln::agent {

void Transcript::append(Message message) {
  assert(!finished() && "nothing is appended after the exit message");
  messages_.push_back(std::move(message));
}

int Transcript::replace_by_compaction(std::vector<Message> compacted) {
  assert(compacted.size() >= 2 && messages_.size() >= 2);
  assert(compacted[0] == messages_[0] && compacted[1] == messages_[1]);
  messages_ = std::move(compacted);
  return ++compactions_;
}

}  // namespace kiln::agent
