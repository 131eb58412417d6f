#include "agent/scripted_chat_model.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace kiln::agent {
namespace {

constexpr int64_t kMessageOverhead = 4;     // <|im_start|>role\n ... <|im_end|>\n
constexpr int64_t kGenerationPrompt = 3;    // <|im_start|>assistant\n<think>\n

int64_t schema_tokens(const std::vector<ToolSchema>& tools) {
  int64_t n = 0;
  for (const auto& t : tools) n += scripted_tokens(t.name) + scripted_tokens(t.description) +
                                   scripted_tokens(t.parameters.dump());
  return n;
}

std::string call_text(const ToolCall& c) { return c.name + c.arguments.dump(); }

}  // namespace

int64_t scripted_tokens(std::string_view text) { return (static_cast<int64_t>(text.size()) + 3) / 4; }

int64_t ScriptedChatModel::message_tokens(const Message& m) {
  if (m.role == Role::assistant) {  // what was generated, after the generation prompt
    int64_t n = kGenerationPrompt + scripted_tokens(m.reasoning) + scripted_tokens(m.content);
    for (const auto& c : m.tool_calls) n += scripted_tokens(call_text(c));
    return n;
  }
  return kMessageOverhead + scripted_tokens(m.content);
}

ScriptedChatModel::ScriptedChatModel(std::vector<ScriptedTurn> script, int64_t context_limit)
    : script_(std::move(script)), context_limit_(context_limit) {}

Result<int64_t> ScriptedChatModel::prompt_tokens(const std::vector<Message>& conversation,
                                                 const std::vector<ToolSchema>& tools) {
  int64_t n = schema_tokens(tools) + kGenerationPrompt;
  for (const auto& m : conversation) n += message_tokens(m);
  return n;
}

std::vector<std::vector<Message>> ScriptedChatModel::shown() const {
  std::lock_guard lock(mutex_);
  return shown_;
}

size_t ScriptedChatModel::turns_used() const {
  std::lock_guard lock(mutex_);
  return next_;
}

ModelTurn ScriptedChatModel::next_turn(const TurnRequest& request, const DeltaSink& on_delta,
                                       const std::atomic<bool>& cancel) {
  ModelTurn out;
  out.message.role = Role::assistant;
  const ScriptedTurn* turn = nullptr;
  {
    std::lock_guard lock(mutex_);
    shown_.push_back(request.conversation);
    if (next_ < script_.size()) turn = &script_[next_++];
  }
  if (turn == nullptr) {
    out.end = TurnEnd::error;
    out.error = "ScriptedChatModel: script exhausted after " + std::to_string(script_.size()) + " turns";
    return out;
  }
  if (turn->expect) turn->expect(request.conversation);

  // Prefill: the held messages that are still a prefix of the conversation are reused.
  auto clock = std::chrono::steady_clock::now();
  size_t common = 0;
  while (common < held_.size() && common < request.conversation.size() &&
         same_for_model(held_[common], request.conversation[common]))
    ++common;
  int64_t reused = schema_tokens(request.tools);
  for (size_t i = 0; i < common; ++i) reused += message_tokens(request.conversation[i]);
  if (held_.empty()) reused = 0;
  int64_t total = *prompt_tokens(request.conversation, request.tools);
  out.usage.reused_tokens = reused;
  out.usage.prefilled_tokens = total - reused;

  // Decode: one "token" per 4 bytes, streamed, cancellable between tokens.
  auto t0 = std::chrono::steady_clock::now();
  out.usage.prefill_s = std::chrono::duration<double>(t0 - clock).count();
  int64_t budget = request.max_new_tokens;
  bool truncated = false;
  auto stream = [&](const std::string& text, TurnDelta::Kind kind, std::string& into) {
    for (size_t pos = 0; pos < text.size(); pos += 4) {
      if (cancel.load()) return false;
      if (out.usage.generated_tokens >= budget) { truncated = true; return false; }
      if (turn->decode_ms_per_token > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(turn->decode_ms_per_token));
      std::string piece = text.substr(pos, 4);
      into += piece;
      ++out.usage.generated_tokens;
      if (kind == TurnDelta::Kind::reasoning) ++out.usage.reasoning_tokens;
      if (on_delta) on_delta({kind, piece});
    }
    return true;
  };
  bool complete = stream(turn->reasoning, TurnDelta::Kind::reasoning, out.message.reasoning) &&
                  stream(turn->text, TurnDelta::Kind::text, out.message.content);
  for (size_t i = 0; complete && i < turn->calls.size(); ++i) {
    int64_t cost = scripted_tokens(call_text(turn->calls[i]));
    if (cancel.load()) { complete = false; break; }
    if (out.usage.generated_tokens + cost > budget) {
      out.usage.generated_tokens = budget;
      truncated = true;
      complete = false;
      break;
    }
    out.usage.generated_tokens += cost;
    out.message.tool_calls.push_back(turn->calls[i]);
    if (on_delta) on_delta({TurnDelta::Kind::tool_call, turn->calls[i].name});
  }
  if (complete) out.call_errors = turn->call_errors;
  out.end = complete ? TurnEnd::stop : (truncated ? TurnEnd::length : TurnEnd::cancelled);
  out.usage.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.usage.context_tokens = total + out.usage.generated_tokens;

  held_ = request.conversation;
  held_.push_back(out.message);
  held_tokens_ = out.usage.context_tokens;
  return out;
}

}  // namespace kiln::agent
