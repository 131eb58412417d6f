// ChatModel: where an assistant turn comes from. The loop hands it the whole conversation and
// the tool schemas; it streams the next assistant turn as deltas and reports exactly what that
// turn cost (tokens prefilled, reused from its cache, generated, reasoning; prefill/decode
// seconds). Implementations:
//   - EngineChatModel (engine_chat_model.h): the in-process engine, one session per build;
//     each turn prefills only the messages appended since the last turn.
//   - ScriptedChatModel (scripted_chat_model.h): replays assistant turns for tests and records
//     what it was shown.
// Threading: one ChatModel belongs to one build and is called from that build's worker thread
// only; `cancel` may be set from any thread and must end next_turn promptly (between tokens).
// Failure: next_turn never throws for model/engine trouble; it returns TurnEnd::error with a
// message naming what failed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/result.h"

namespace kiln::agent {

using Json = nlohmann::ordered_json;

// `exit` is the transcript's last entry saying why the build stopped; never shown to a model.
enum class Role { system, user, assistant, tool, exit };
std::string_view role_name(Role role);

struct ToolCall {
  std::string id{};  // unique within the build ("call_<step>_<index>"), set by the loop
  std::string name{};
  Json arguments = Json::object();
  bool operator==(const ToolCall&) const = default;
};

struct Message {
  Role role = Role::user;
  std::string content{};
  std::string reasoning{};             // assistant: the <think> text
  std::vector<ToolCall> tool_calls{};  // assistant
  std::string tool_call_id{};          // tool: which call this answers
  std::string name{};                  // tool: the tool's name
  bool operator==(const Message&) const = default;
};

Json message_to_json(const Message& message);
// Equal as a model sees them: ignores the call ids the loop assigns (the template does not
// render them), so a model can recognise the turns it already holds.
bool same_for_model(const Message& a, const Message& b);
Message make_message(Role role, std::string content);
Message tool_message(std::string content, std::string tool_call_id, std::string name);

struct ToolSchema {
  std::string name;
  std::string description;
  Json parameters = Json::object();  // JSON schema of the arguments
};

struct TurnUsage {
  int64_t prefilled_tokens = 0;  // tokens run through prefill for this turn (new messages + prompt)
  int64_t reused_tokens = 0;     // tokens already in the cache, not recomputed
  int64_t generated_tokens = 0;  // sampled tokens, reasoning included
  int64_t reasoning_tokens = 0;  // of generated_tokens, those inside <think>
  int64_t context_tokens = 0;    // tokens held by the session after the turn
  // Of prefilled_tokens, history computed again because the engine had given this session's KV
  // memory to another build (an idle reclaim or a preemption).
  int64_t rebuilt_tokens = 0;
  // Speculative decoding: draft tokens verified, and those accepted (of generated_tokens; each
  // saved a decode step).
  int64_t draft_tokens = 0;
  int64_t draft_accepted = 0;
  double prefill_s = 0;
  double decode_s = 0;
  // Waiting for engine memory (a new session's first prompt, while running builds held the KV
  // pages); in neither prefill_s nor decode_s.
  double wait_s = 0;
};

enum class TurnEnd { stop, length, cancelled, error };

struct ModelTurn {
  Message message;                       // the assistant turn as generated (parsed)
  std::vector<std::string> call_errors;  // one per malformed tool call: the parser's message
  TurnEnd end = TurnEnd::stop;
  std::string error;  // TurnEnd::error: what failed
  TurnUsage usage;
};

struct TurnDelta {
  // waiting_for_memory ... memory_granted: the engine has no memory for this build yet (running
  // builds hold it); that span is not the build's own time: the loop emits one
  // {"phase": "waiting_for_memory", "model", "message"} status event and its wall-time limit
  // pauses. Every waiting_for_memory is followed by one memory_granted (also on cancel).
  enum class Kind { reasoning, text, tool_call, waiting_for_memory, memory_granted };
  Kind kind = Kind::text;
  // reasoning/text: the new piece; tool_call: the call's name; waiting_for_memory: the engine's
  // reason; memory_granted: empty
  std::string text;
};
using DeltaSink = std::function<void(const TurnDelta&)>;

struct TurnRequest {
  const std::vector<Message>& conversation;  // system, task, then turns; ends with user/tool
  const std::vector<ToolSchema>& tools;
  int64_t max_new_tokens = 0;
};

class ChatModel {
 public:
  virtual ~ChatModel() = default;
  virtual std::string name() const = 0;
  // The most tokens a session may hold (prompt + generated), known exactly from the model.
  virtual int64_t context_limit() const = 0;
  // Exact context length once `conversation` is prefilled with the generation prompt, without
  // prefilling anything. The loop uses it to decide on compaction before a turn.
  virtual Result<int64_t> prompt_tokens(const std::vector<Message>& conversation,
                                        const std::vector<ToolSchema>& tools) = 0;
  virtual ModelTurn next_turn(const TurnRequest& request, const DeltaSink& on_delta,
                              const std::atomic<bool>& cancel) = 0;
};

}  // namespace kiln::agent
