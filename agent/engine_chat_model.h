// EngineChatModel: a ChatModel over kiln's in-process engine. One engine session per build,
// alive for the whole build, so each turn prefills only what was appended since the last one:
//
//   turn 1   [system + task]<|im_end|>  ← checkpoint "base"   + "\n<|im_start|>assistant\n<think>\n"
//   turn n   … generated tokens of turn n-1, exactly as sampled (ending <|im_end|>)
//            + "\n" + the new tool/user messages + the generation prompt
//
// The text appended is the full render of the conversation minus the full render up to the last
// held assistant turn (append-only with preserve_thinking, chat_template.h), so the session holds
// the model's own tokens, never a re-rendering of them. Compaction (the conversation is no
// longer an extension of what the session holds) rewinds to "base" and prefills the rest once.
// Usage per turn: prefilled = tokens appended, reused = the session's length before; so over a
// build sum(prefilled) + sum(generated) == the session's length (without compaction).
// Threading: one build thread; `cancel` is checked after every sampled token.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/chat_model.h"
#include "engine/chat/chat_template.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

namespace kiln::agent {

struct EngineChatModelOptions {
  engine::SamplingParams sampling;  // the caller's choice (model-spec §9.2 lists the card's)
  bool enable_thinking = true;
  int64_t context_limit = 0;        // 0: the model's max_position_embeddings
  // Prompt-lookup speculative decoding (engine/prompt_lookup.h): same tokens, fewer steps where
  // the model repeats its context (an edit quoting the file it read); adaptive, so drafts are
  // only verified where they are expected to pay. draft_tokens = 0 turns it off.
  engine::SpeculativeOptions speculative{8};
};

class EngineChatModel final : public ChatModel {
 public:
  // Opens a session on `model`. Without `admission` it fails when the engine has no free session
  // slot; with it, it waits in line (admission.priority, admission.on_wait with the position).
  static Result<std::unique_ptr<EngineChatModel>> open(engine::Model& model, const engine::Tokenizer& tokenizer,
                                                       std::string name, EngineChatModelOptions options = {},
                                                       const engine::OpenOptions* admission = nullptr);

  std::string name() const override { return name_; }
  int64_t context_limit() const override { return context_limit_; }
  Result<int64_t> prompt_tokens(const std::vector<Message>& conversation,
                                const std::vector<ToolSchema>& tools) override;
  ModelTurn next_turn(const TurnRequest& request, const DeltaSink& on_delta,
                      const std::atomic<bool>& cancel) override;

  const engine::Session& session() const { return *session_; }
  int rebuilds() const { return rebuilds_; }  // times the session was rewound to base (compaction)

 private:
  EngineChatModel(engine::Model& model, const engine::Tokenizer& tokenizer, std::unique_ptr<engine::Session> session,
                  std::string name, EngineChatModelOptions options);

  // What must be appended to the session before the next generation.
  struct Pending {
    bool rewind = false;               // rewind to base first (compaction, or the first turn)
    std::vector<engine::TokenId> tokens;
    size_t base_tokens = 0;            // first turn: tokens[0, base_tokens) are the base
  };
  Result<Pending> pending(const std::vector<Message>& conversation, const std::vector<ToolSchema>& tools);
  Result<engine::RenderResult> render(const std::vector<Message>& messages, const std::vector<ToolSchema>& tools,
                                      bool generation_prompt) const;
  // The session's first append: while the engine refuses it for memory (running builds hold the
  // KV pages), waits and tries again as they give pages back, until cancel; adds the wait to wait_s.
  engine::Result<std::vector<float>> first_append(std::span<const engine::TokenId> tokens,
                                                  const std::atomic<bool>& cancel, double& wait_s,
                                                  const DeltaSink& on_delta);
  // Tokens of bytes [from, to) of a render: the messages' own text is never an added token.
  void encode_slice(const engine::RenderResult& r, size_t from, size_t to, std::vector<engine::TokenId>& out) const;

  engine::Model& model_;
  const engine::Tokenizer& tokenizer_;
  std::unique_ptr<engine::Session> session_;
  const std::string name_;
  const EngineChatModelOptions options_;
  int64_t context_limit_ = 0;
  engine::TemplateFlavor flavor_ = engine::TemplateFlavor::qwen3_6;
  engine::TokenId im_end_ = -1, endoftext_ = -1;
  std::vector<Message> held_;  // messages the session holds, ending with an assistant turn
  std::optional<engine::SessionCheckpoint> base_;  // after [system, task]<|im_end|>
  std::string base_text_;
  int rebuilds_ = 0;
};

}  // namespace kiln::agent
