// Transcript: the build's conversation, append-only. Appending is the only way it changes, so
// an in-process model session can keep its cache from turn to turn (each turn prefills only
// what was appended). The one sanctioned rewrite is compaction (compaction.h), done through
// replace_by_compaction() and recorded as an event by the loop. The last entry of a finished
// build is a Role::exit message saying why it stopped (mini-swe-agent's exit message).
// Owned by the build thread.
#pragma once

#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

class Transcript {
 public:
  void append(Message message);
  const std::vector<Message>& messages() const { return messages_; }
  const Message& back() const { return messages_.back(); }
  size_t size() const { return messages_.size(); }
  bool finished() const { return !messages_.empty() && messages_.back().role == Role::exit; }
  // Replaces the whole conversation by its compacted form (the first two entries, system and
  // task, must be unchanged). Returns the number of compactions so far.
  int replace_by_compaction(std::vector<Message> compacted);

 private:
  std::vector<Message> messages_;
  int compactions_ = 0;
};

}  // namespace kiln::agent
