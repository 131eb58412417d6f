// ScriptedChatModel: the test double for the agent (mini-swe-agent's DeterministicModel).
// Replays a fixed list of assistant turns and records every conversation it was shown, so a
// test can check both what the loop did and what the model saw.
//
// It behaves like a session-backed model so the loop's accounting can be checked: it counts
// tokens with a fixed rule (scripted_tokens: 1 token per 4 bytes, rounded up, plus 4 per
// message and 3 for the generation prompt), keeps the messages it has "prefilled", and per turn
// reports as prefilled only the messages not already held (reused = the common prefix).
// Threading: like every ChatModel, one build thread; `cancel` is polled once per token.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

struct ScriptedTurn {
  std::string reasoning{};
  std::string text{};
  std::vector<ToolCall> calls{};          // ids are left empty: the loop assigns them
  std::vector<std::string> call_errors{};  // what a parser would report for malformed calls
  int decode_ms_per_token = 0;           // > 0 makes generation take time (wall-time, cancel tests)
  // Runs on the conversation the turn was asked for (use gtest EXPECTs inside).
  std::function<void(const std::vector<Message>&)> expect{};
};

// The scripted model's token count of a text: ceil(bytes / 4).
int64_t scripted_tokens(std::string_view text);

class ScriptedChatModel final : public ChatModel {
 public:
  explicit ScriptedChatModel(std::vector<ScriptedTurn> script, int64_t context_limit = 1 << 20);

  std::string name() const override { return "scripted"; }
  int64_t context_limit() const override { return context_limit_; }
  Result<int64_t> prompt_tokens(const std::vector<Message>& conversation,
                                const std::vector<ToolSchema>& tools) override;
  ModelTurn next_turn(const TurnRequest& request, const DeltaSink& on_delta,
                      const std::atomic<bool>& cancel) override;

  // What the model was shown, one conversation per call of next_turn (thread-safe copies).
  std::vector<std::vector<Message>> shown() const;
  size_t turns_used() const;
  // Tokens of one message as this model renders it in history.
  static int64_t message_tokens(const Message& message);

 private:
  std::vector<ScriptedTurn> script_;
  int64_t context_limit_;
  mutable std::mutex mutex_;
  std::vector<std::vector<Message>> shown_;  // guarded by mutex_
  size_t next_ = 0;                          // guarded by mutex_
  std::vector<Message> held_;                // the simulated session's messages (build thread)
  int64_t held_tokens_ = 0;
};

}  // namespace kiln::agent
