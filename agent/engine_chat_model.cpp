#include "agent/engine_chat_model.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "engine/chat/tool_call_parser.h"

namespace kiln::agent {
namespace {

using Clock = std::chrono::steady_clock;

engine::Role engine_role(Role role) {
  switch (role) {
    case Role::system: return engine::Role::system;
    case Role::assistant: return engine::Role::assistant;
    case Role::tool: return engine::Role::tool;
    default: return engine::Role::user;
  }
}

engine::ChatMessage to_engine(const Message& m) {
  engine::ChatMessage out;
  out.role = engine_role(m.role);
  out.content = m.content;
  if (m.role == Role::assistant) out.reasoning_content = m.reasoning;
  for (const auto& c : m.tool_calls) out.tool_calls.push_back({c.name, c.arguments, c.id});
  out.tool_call_id = m.tool_call_id;
  return out;
}

std::vector<engine::Json> tool_objects(const std::vector<ToolSchema>& tools) {
  std::vector<engine::Json> out;
  for (const auto& t : tools)
    out.push_back({{"type", "function"},
                   {"function", {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}}}});
  return out;
}

bool is_prefix(const std::vector<Message>& prefix, const std::vector<Message>& of) {
  if (prefix.size() > of.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (!same_for_model(prefix[i], of[i])) return false;
  return true;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

Result<std::unique_ptr<EngineChatModel>> EngineChatModel::open(engine::Model& model, const engine::Tokenizer& tokenizer,
                                                               std::string name, EngineChatModelOptions options,
                                                               const engine::OpenOptions* admission) {
  auto session = admission ? model.open_session_waiting(*admission) : model.open_session();
  if (!session) return Error{"engine session for " + name + ": " + session.error()};
  auto im_end = tokenizer.token_id("<|im_end|>");
  auto endoftext = tokenizer.token_id("<|endoftext|>");
  if (!im_end || !endoftext) return Error{"tokenizer of " + name + ": no <|im_end|> or <|endoftext|> token"};
  std::unique_ptr<EngineChatModel> m(
      new EngineChatModel(model, tokenizer, std::move(session.value()), std::move(name), options));
  m->im_end_ = *im_end;
  m->endoftext_ = *endoftext;
  return m;
}

EngineChatModel::EngineChatModel(engine::Model& model, const engine::Tokenizer& tokenizer,
                                 std::unique_ptr<engine::Session> session, std::string name,
                                 EngineChatModelOptions options)
    : model_(model), tokenizer_(tokenizer), session_(std::move(session)), name_(std::move(name)), options_(options) {
  context_limit_ = model.config().max_position_embeddings;
  if (options.context_limit > 0 && options.context_limit < context_limit_) context_limit_ = options.context_limit;
  if (!tokenizer.chat_template().empty()) flavor_ = engine::detect_flavor(tokenizer.chat_template());
}

engine::Result<std::vector<float>> EngineChatModel::first_append(std::span<const engine::TokenId> tokens,
                                                                 const std::atomic<bool>& cancel, double& wait_s,
                                                                 const DeltaSink& on_delta) {
  std::optional<Clock::time_point> waiting_since;
  for (;;) {
    auto appended = session_->append(tokens, false, &cancel);
    if (appended || !session_->refused_for_memory() || cancel.load()) {
      if (waiting_since) {
        wait_s += seconds_since(*waiting_since);
        if (on_delta) on_delta({TurnDelta::Kind::memory_granted, {}});
      }
      return appended;
    }
    if (!waiting_since) {
      waiting_since = Clock::now();
      if (on_delta) on_delta({TurnDelta::Kind::waiting_for_memory, appended.error()});
    }
    // Pages come back when another build's call ends; a tenth of a second is a small delay
    // against minutes of building, and a refused try costs the engine almost nothing.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Result<engine::RenderResult> EngineChatModel::render(const std::vector<Message>& messages,
                                                     const std::vector<ToolSchema>& tools, bool generation_prompt) const {
  engine::Conversation conv;
  for (const auto& m : messages) conv.messages.push_back(to_engine(m));
  conv.tools = tool_objects(tools);
  engine::RenderOptions options = engine::append_only_options(flavor_, options_.enable_thinking);
  options.add_generation_prompt = generation_prompt;
  auto r = engine::render_chat(conv, options);
  if (!r.ok()) return Error{"chat template: " + r.error};
  return r;
}

void EngineChatModel::encode_slice(const engine::RenderResult& r, size_t from, size_t to,
                                   std::vector<engine::TokenId>& out) const {
  const auto spans = engine::spans_from(r.literal_spans, from, to);
  tokenizer_.encode_append(std::string_view(r.text).substr(from, to - from), out, spans);
}

// The tokens to append: after the last held assistant turn, or after "base" (first turn,
// compaction). Text boundaries sit right after an <|im_end|> so BPE never merges across them.
// Where the new render does not extend what the session holds (the Qwen3.5 template drops the
// reasoning of turns before a new user message), the session is rewound to base and everything
// after it prefilled again.
Result<EngineChatModel::Pending> EngineChatModel::pending(const std::vector<Message>& conversation,
                                                          const std::vector<ToolSchema>& tools) {
  if (conversation.size() < 2) return Error{"the conversation needs a system prompt and a task"};
  auto full = render(conversation, tools, true);
  if (!full) return Error{full.error()};
  const std::string& text = full->text;
  Pending p;
  // A turn that ended in <|endoftext|> keeps it, followed by <|im_end|>: slightly off the
  // template's text, but rebuilding from the task instead would prefill the whole conversation.
  if (base_ && !held_.empty() && !session_->tokens().empty() && is_prefix(held_, conversation)) {
    auto prefix = render(held_, tools, false);
    if (!prefix) return Error{prefix.error()};
    const std::string& held_text = prefix->text;
    if (text.compare(0, held_text.size(), held_text) == 0 && !held_text.empty() && held_text.back() == '\n') {
      if (session_->tokens().back() != im_end_) p.tokens.push_back(im_end_);
      encode_slice(*full, held_text.size() - 1, text.size(), p.tokens);
      return p;
    }
  }
  std::vector<Message> head(conversation.begin(), conversation.begin() + 2);
  auto head_render = render(head, tools, false);
  if (!head_render) return Error{head_render.error()};
  const size_t base_size = head_render->text.size() - 1;  // up to <|im_end|>
  std::string base_text = head_render->text.substr(0, base_size);
  if (text.compare(0, base_text.size(), base_text) != 0)
    return Error{"chat template: the render of the system prompt and task is not a prefix of the conversation"};
  if (base_) {
    if (base_text != base_text_) return Error{"the system prompt or task changed: the session cannot be reused"};
    p.rewind = true;
  } else {
    encode_slice(*head_render, 0, base_size, p.tokens);  // first turn: base is created from these
    p.base_tokens = p.tokens.size();
  }
  encode_slice(*full, base_size, text.size(), p.tokens);
  if (!base_) base_text_ = base_text;
  return p;
}

Result<int64_t> EngineChatModel::prompt_tokens(const std::vector<Message>& conversation,
                                               const std::vector<ToolSchema>& tools) {
  auto p = pending(conversation, tools);
  if (!p) return Error{p.error()};
  int64_t start = p->rewind ? static_cast<int64_t>(base_->tokens.size()) : session_->size();
  return start + static_cast<int64_t>(p->tokens.size());
}

ModelTurn EngineChatModel::next_turn(const TurnRequest& request, const DeltaSink& on_delta,
                                     const std::atomic<bool>& cancel) {
  ModelTurn out;
  out.message.role = Role::assistant;
  auto fail = [&](std::string message) {
    out.end = TurnEnd::error;
    out.error = name_ + ": " + std::move(message);
    out.usage.context_tokens = session_->size();
    return out;
  };
  const bool first = !base_;
  if (first && session_->size() > 0) return fail("the session's first prefill was interrupted; it cannot be reused");
  auto p = pending(request.conversation, request.tools);
  if (!p) return fail(p.error());
  // A prefill stopped by `cancel` leaves part of the new tokens in the session: the turn ends as
  // cancelled, and a later turn starts again from base (or, before base exists, refuses).
  auto prefill_failed = [&](const std::string& error) {
    held_.clear();
    if (!cancel.load()) return fail("prefill: " + error);
    ModelTurn stopped = fail("prefill: " + error);
    stopped.end = TurnEnd::cancelled;
    return stopped;
  };

  // Prefill only what is new.
  auto t0 = Clock::now();
  const int64_t rebuilt_before = session_->rebuilt_tokens();
  if (p->rewind) {
    if (auto s = session_->rewind(*base_); !s.ok()) return fail("rewind to the task: " + s.error());
    ++rebuilds_;
  }
  out.usage.reused_tokens = session_->size();
  out.usage.prefilled_tokens = static_cast<int64_t>(p->tokens.size());
  if (first) {
    auto a = first_append(std::span(p->tokens).first(p->base_tokens), cancel, out.usage.wait_s, on_delta);
    if (!a) return prefill_failed(a.error());
    base_ = session_->checkpoint();
    auto b = session_->append(std::span(p->tokens).subspan(p->base_tokens), false, &cancel);
    if (!b) return prefill_failed(b.error());
  } else if (auto a = session_->append(p->tokens, false, &cancel); !a) {
    return prefill_failed(a.error());
  }
  // The engine took this idle session's KV for another build and re-prefilled it now: those
  // tokens were computed again, not reused.
  // (Preempted part way through the append, the chunks already run count again too: prefilled
  // is what was computed, so then prefilled + reused exceeds the prompt.)
  const int64_t rebuilt = session_->rebuilt_tokens() - rebuilt_before;
  out.usage.prefilled_tokens += rebuilt;
  out.usage.rebuilt_tokens += rebuilt;
  out.usage.reused_tokens = std::max<int64_t>(0, out.usage.reused_tokens - rebuilt);
  out.usage.prefill_s = seconds_since(t0) - out.usage.wait_s;

  // Decode, parsing as the text streams out.
  engine::ToolCallParser parser(tool_objects(request.tools), {options_.enable_thinking});
  engine::StreamingDecoder decoder(tokenizer_);
  bool in_reasoning = options_.enable_thinking;
  std::string tail;  // the last decoded bytes, to see "</think>" across token boundaries
  auto forward = [&](const engine::ParsedOutput& parsed) {
    if (!on_delta) return;
    if (!parsed.reasoning.empty()) on_delta({TurnDelta::Kind::reasoning, parsed.reasoning});
    if (!parsed.content.empty()) on_delta({TurnDelta::Kind::text, parsed.content});
    for (const auto& c : parsed.tool_calls) on_delta({TurnDelta::Kind::tool_call, c.name});
  };
  engine::GenerateOptions g;
  g.sampling = options_.sampling;
  if (g.sampling.vocab_limit == 0) g.sampling.vocab_limit = static_cast<int64_t>(tokenizer_.vocab_size());
  g.max_tokens = request.max_new_tokens;
  g.stop = {im_end_, endoftext_};
  g.cancel = &cancel;  // while it waits for memory, when no token (and no callback) comes
  g.speculative = options_.speculative;
  auto t1 = Clock::now();
  auto generated = request.max_new_tokens > 0
                       ? session_->generate(g, [&](int32_t tok) {
                           if (in_reasoning) ++out.usage.reasoning_tokens;
                           if (tok != im_end_ && tok != endoftext_) {
                             std::string text = decoder.push(tok);
                             tail = (tail + text).substr(tail.size() + text.size() > 16 ? tail.size() + text.size() - 16 : 0);
                             if (tail.find("</think>") != std::string::npos) in_reasoning = false;
                             forward(parser.feed(text));
                           }
                           return !cancel.load();
                         })
                       : engine::Result<engine::GenerateResult>(engine::GenerateResult{});
  out.usage.decode_s = seconds_since(t1);
  if (!generated) {
    ModelTurn failed = fail("generate: " + generated.error());
    if (cancel.load()) failed.end = TurnEnd::cancelled;
    return failed;
  }
  // Preempted while generating (a higher-ranked build took its KV): its history was run again.
  if (const int64_t again = session_->rebuilt_tokens() - rebuilt_before - rebuilt; again > 0) {
    out.usage.prefilled_tokens += again;
    out.usage.rebuilt_tokens += again;
    out.usage.reused_tokens = std::max<int64_t>(0, out.usage.reused_tokens - again);
  }
  forward(parser.feed(decoder.flush()));
  forward(parser.finish());

  const auto& total = parser.total();
  out.message.reasoning = total.reasoning;
  out.message.content = total.content;
  for (const auto& c : total.tool_calls) out.message.tool_calls.push_back({"", c.name, c.arguments});
  for (const auto& e : total.errors) out.call_errors.push_back(e.message);
  out.usage.generated_tokens = static_cast<int64_t>(generated->tokens.size());
  out.usage.draft_tokens = generated->draft_tokens;
  out.usage.draft_accepted = generated->draft_accepted;
  out.usage.context_tokens = session_->size();
  using Reason = engine::GenerateResult::Reason;
  out.end = generated->reason == Reason::stop_token ? TurnEnd::stop
            : generated->reason == Reason::callback ? TurnEnd::cancelled
                                                    : TurnEnd::length;
  held_ = request.conversation;
  held_.push_back(out.message);
  return out;
}

}  // namespace kiln::agent
