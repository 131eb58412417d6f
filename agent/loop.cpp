// The agent loop (mini-swe-agent's run/step/query/execute_actions, in C++).
// Agent::run is the whole story; the helpers below it each do one step and return either
// nothing (go on) or a Stop (finished, with its reason and message).
#include "agent/loop.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "agent/compaction.h"
#include "agent/transcript.h"

namespace kiln::agent {
namespace {

using Clock = std::chrono::steady_clock;

struct Stop {
  StopReason reason;
  std::string message;
};
using MaybeStop = std::optional<Stop>;

// Sets the stop signal with time_limit when the deadline passes, so a long generation or tool
// call is interrupted at the deadline rather than after it. Owns its thread (RAII). Paused while
// the build waits for engine memory (not its own time): resume() moves the deadline by the pause.
class Watchdog {
 public:
  Watchdog(StopSignal& stop, Deadline deadline)
      : deadline_(deadline), thread_([this, &stop] {
          std::unique_lock lock(mutex_);
          for (;;) {
            if (done_) return;
            if (paused_since_) {
              cv_.wait(lock);
            } else if (cv_.wait_until(lock, deadline_.at, [this] { return done_ || paused_since_.has_value(); })) {
              continue;
            } else if (Clock::now() >= deadline_.at) {
              stop.request(StopCause::time_limit);
              return;
            }
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void pause() {
    std::lock_guard lock(mutex_);
    if (!paused_since_) paused_since_ = Clock::now();
    cv_.notify_all();
  }
  // Ends a pause; the deadline, later by its length.
  Deadline resume() {
    std::lock_guard lock(mutex_);
    if (paused_since_) {
      deadline_.at += Clock::now() - *paused_since_;
      paused_since_.reset();
    }
    cv_.notify_all();
    return deadline_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;                            // guarded by mutex_
  Deadline deadline_;                            // guarded by mutex_
  std::optional<Clock::time_point> paused_since_;  // guarded by mutex_
  std::thread thread_;                           // last: starts after the above exist
};

class Agent {
 public:
  Agent(const AgentTask& task, const Limits& limits, ChatModel& model, ToolExecutor& tools, EventSink& events,
        StopSignal& stop)
      : task_(task), limits_(limits), model_(model), tools_(tools), events_(events), stop_(stop),
        schemas_(tools.schemas()), deadline_(Deadline::after(limits.max_wall_s)) {}

  AgentResult run() {
    transcript_.append(make_message(Role::system, system_prompt(task_)));
    transcript_.append(make_message(Role::user, task_message(task_)));
    emit("status", {{"phase", "agent"}, {"model", model_.name()}, {"context_limit", model_.context_limit()}});
    Watchdog watchdog(stop_, deadline_);
    watchdog_ = &watchdog;
    MaybeStop stop;
    while (!stop) {
      stop = check_stop();                   // cancel, lost lease, steps, tokens, wall time
      if (!stop) stop = make_room();         // compact if the next turn would not fit
      if (stop) break;
      ModelTurn turn = query();              // one assistant turn, streamed out as events
      stop = record_turn(turn);              // appended exactly as generated; usage counted
      if (!stop) stop = execute_actions(turn);  // tools, malformed calls, loop detection
    }
    return finish(*stop);
  }

 private:
  MaybeStop check_stop() {
    if (stop_.requested()) return stop_from_signal();
    if (auto b = check_budgets(limits_, counters_, deadline_)) return Stop{b->reason, b->message};
    return std::nullopt;
  }

  MaybeStop stop_from_signal() const {
    switch (stop_.cause()) {
      case StopCause::cancelled: return Stop{StopReason::cancelled, "the build was cancelled"};
      case StopCause::lease_lost: return Stop{StopReason::lease_lost, "this worker lost the build's lease"};
      case StopCause::time_limit:
        return Stop{StopReason::time_limit,
                    "time limit reached: " + std::to_string(static_cast<int64_t>(limits_.max_wall_s)) + " s of wall time"};
      case StopCause::shutdown: return Stop{StopReason::shutdown, "the worker is shutting down"};
      case StopCause::none: break;
    }
    return Stop{StopReason::cancelled, "stopped"};
  }

  // Context overflow: compact deterministically, keeping fewer whole turns until it fits.
  MaybeStop make_room() {
    auto needed = model_.prompt_tokens(transcript_.messages(), schemas_);
    if (!needed) return Stop{StopReason::model_error, "cannot render the conversation: " + needed.error()};
    int64_t room = std::min<int64_t>(limits_.max_turn_tokens, limits_.min_turn_tokens);
    prompt_tokens_ = *needed;
    if (prompt_tokens_ + room <= model_.context_limit()) return std::nullopt;
    // Fewer whole turns first; at zero, the unread results of the last turn are cut last of all.
    std::vector<std::pair<int, size_t>> stages;
    for (int keep = limits_.keep_recent_turns; keep >= 0; --keep) stages.emplace_back(keep, SIZE_MAX);
    for (size_t unread : {size_t(16) << 10, size_t(4) << 10, size_t(1) << 10, size_t(256)}) stages.emplace_back(0, unread);
    for (const auto& [keep, unread] : stages) {
      auto compacted = compact_conversation(transcript_.messages(), keep, unread);
      auto after = model_.prompt_tokens(compacted, schemas_);
      if (!after) return Stop{StopReason::model_error, "cannot render the compacted conversation: " + after.error()};
      if (*after + room > model_.context_limit()) continue;
      Json details = {{"tokens_before", prompt_tokens_}, {"tokens_after", *after}, {"keep_recent_turns", keep},
                      {"messages", compacted.size()}, {"context_limit", model_.context_limit()}};
      if (unread != SIZE_MAX) details["unread_output_cut_to_bytes"] = unread;
      emit("compaction", details);
      counters_.compactions = transcript_.replace_by_compaction(std::move(compacted));
      prompt_tokens_ = *after;
      return std::nullopt;
    }
    return Stop{StopReason::token_limit, "context full: the conversation needs " + std::to_string(prompt_tokens_) +
                                             " tokens and cannot be compacted below the model's limit of " +
                                             std::to_string(model_.context_limit())};
  }

  ModelTurn query() {
    int64_t max_new = std::min({limits_.max_turn_tokens, limits_.max_generated_tokens - counters_.generated_tokens,
                                model_.context_limit() - prompt_tokens_});
    TextBatcher batcher(events_);
    auto on_delta = [&](const TurnDelta& d) {
      if (d.kind == TurnDelta::Kind::tool_call) return;  // the whole call is emitted when it runs
      // Waiting for engine memory is not the build's time: the wall-time limit stops meanwhile.
      if (d.kind == TurnDelta::Kind::waiting_for_memory) {
        watchdog_->pause();
        emit("status", {{"phase", "waiting_for_memory"}, {"model", model_.name()}, {"message", d.text}});
        return;
      }
      if (d.kind == TurnDelta::Kind::memory_granted) {
        deadline_ = watchdog_->resume();
        return;
      }
      batcher.add(d.kind == TurnDelta::Kind::reasoning ? "reasoning" : "model_text", d.text);
    };
    ModelTurn turn = model_.next_turn({transcript_.messages(), schemas_, max_new}, on_delta, stop_.flag());
    if (!batcher.flush()) stop_.request(StopCause::lease_lost);
    return turn;
  }

  MaybeStop record_turn(ModelTurn& turn) {
    counters_.add_turn(turn.usage);
    for (size_t i = 0; i < turn.message.tool_calls.size(); ++i)
      turn.message.tool_calls[i].id = "call_" + std::to_string(counters_.steps) + "_" + std::to_string(i);
    transcript_.append(turn.message);
    const auto& u = turn.usage;
    Json metric = {{"step", counters_.steps}, {"tokens_prefilled", u.prefilled_tokens},
                   {"tokens_reused", u.reused_tokens}, {"tokens_generated", u.generated_tokens},
                   {"tokens_reasoning", u.reasoning_tokens}, {"context_tokens", u.context_tokens},
                   {"prefill_s", u.prefill_s}, {"decode_s", u.decode_s}};
    // Only when they happened: waiting for engine memory, history the engine had to compute
    // again, draft tokens verified.
    if (u.wait_s > 0) metric["wait_s"] = u.wait_s;
    if (u.rebuilt_tokens > 0) metric["tokens_rebuilt"] = u.rebuilt_tokens;
    if (u.draft_tokens > 0) {  // speculative decoding ran: how much of it the model confirmed
      metric["tokens_drafted"] = u.draft_tokens;
      metric["tokens_draft_accepted"] = u.draft_accepted;
    }
    emit("metric", metric);
    switch (turn.end) {
      case TurnEnd::stop: return std::nullopt;
      case TurnEnd::cancelled: return stop_.requested() ? stop_from_signal() : Stop{StopReason::model_error, "the model stopped the turn"};
      case TurnEnd::error: return Stop{StopReason::model_error, "the model failed: " + turn.error};
      case TurnEnd::length:
        if (counters_.generated_tokens >= limits_.max_generated_tokens) return check_stop();
        if (prompt_tokens_ + u.generated_tokens >= model_.context_limit())
          return Stop{StopReason::token_limit, "context full: the turn filled the model's context"};
        return std::nullopt;  // cut at max_turn_tokens: execute_actions reports it as a format error
    }
    return std::nullopt;
  }

  MaybeStop execute_actions(const ModelTurn& turn) {
    const auto& calls = turn.message.tool_calls;
    for (const auto& error : turn.call_errors)
      observe(tool_message("Error: your tool call could not be parsed: " + error, "", "error"));
    if (turn.end == TurnEnd::length)
      observe(make_message(Role::user, "Your reply was cut off at " + std::to_string(turn.usage.generated_tokens) +
                                              " tokens. Think less and call one tool."));
    else if (calls.empty() && turn.call_errors.empty())
      observe(make_message(Role::user, "Your reply had no tool call. Use a tool to make progress, or call "
                                              "`submit` with a summary when the task is done."));
    bool malformed = !turn.call_errors.empty() || calls.empty() || turn.end == TurnEnd::length;
    format_errors_ = malformed ? format_errors_ + 1 : 0;
    if (format_errors_ >= limits_.max_format_errors)
      return Stop{StopReason::model_error, std::to_string(format_errors_) + " malformed turns in a row"};
    for (const auto& call : calls) {
      if (auto stop = run_tool(call)) return stop;
    }
    return std::nullopt;
  }

  MaybeStop run_tool(const ToolCall& call) {
    emit("tool_call", {{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}, {"step", counters_.steps}});
    auto t0 = Clock::now();
    ToolObservation obs = tools_.run(call, std::max(0.0, deadline_.remaining_s()), stop_.flag());
    double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    counters_.add_tool(call.name, seconds);
    emit("tool_result", {{"id", call.id}, {"name", call.name}, {"ok", obs.ok}, {"output", obs.text},
                         {"data", obs.data}, {"seconds", seconds}});
    observe(tool_message(obs.text, call.id, call.name));
    if (obs.infra_error) return Stop{StopReason::infra_error, "tool `" + call.name + "` failed: " + obs.text};
    if (obs.submitted) {
      summary_ = obs.summary;
      return Stop{StopReason::submitted, "submitted: " + obs.summary};
    }
    if (stop_.requested()) return stop_from_signal();
    return detect_loop(call, obs.text);
  }

  // The same call with the same result `loop_repeats` times in a row: warn once, then stop.
  MaybeStop detect_loop(const ToolCall& call, const std::string& result) {
    std::string signature = call.name + '\x1f' + call.arguments.dump() + '\x1f' + result;
    repeats_ = signature == last_signature_ ? repeats_ + 1 : 1;
    last_signature_ = std::move(signature);
    if (repeats_ < limits_.loop_repeats) return std::nullopt;
    if (loop_warned_)
      return Stop{StopReason::model_error, "loop: the same `" + call.name + "` call gave the same result " +
                                               std::to_string(repeats_) + " times in a row after a warning"};
    loop_warned_ = true;
    emit("log", {{"level", "warning"}, {"message", "loop detected: identical `" + call.name + "` call and result " +
                                                      std::to_string(repeats_) + " times"}});
    observe(make_message(Role::user, "You have made the same `" + call.name + "` call " + std::to_string(repeats_) +
                                            " times with the same result. Try something different; "
                                            "if it happens again the build ends."));
    return std::nullopt;
  }

  AgentResult finish(const Stop& stop) {
    transcript_.append(make_message(Role::exit, std::string(stop_reason_name(stop.reason)) + ": " + stop.message));
    emit("status", {{"phase", "agent_finished"}, {"reason", stop_reason_name(stop.reason)}, {"message", stop.message}});
    emit("metric", counters_.to_json());
    return {stop.reason, stop.message, summary_, counters_, transcript_.messages()};
  }

  void observe(Message message) {
    if (message.role == Role::user) emit("log", {{"level", "info"}, {"message", message.content}});
    transcript_.append(std::move(message));
  }

  void emit(std::string_view kind, const Json& payload) {
    if (!events_.emit(kind, payload)) stop_.request(StopCause::lease_lost);
  }

  const AgentTask& task_;
  const Limits& limits_;
  ChatModel& model_;
  ToolExecutor& tools_;
  EventSink& events_;
  StopSignal& stop_;
  const std::vector<ToolSchema> schemas_;
  Deadline deadline_;            // moved later by waits for engine memory
  Watchdog* watchdog_ = nullptr;  // run()'s, while it runs
  Transcript transcript_;
  Counters counters_;
  int64_t prompt_tokens_ = 0;  // context length the next turn starts from (from make_room)
  int format_errors_ = 0;      // consecutive malformed turns
  std::string last_signature_;
  int repeats_ = 0;
  bool loop_warned_ = false;
  std::string summary_;
};

}  // namespace

AgentResult run_agent(const AgentTask& task, const Limits& limits, ChatModel& model, ToolExecutor& tools,
                      EventSink& events, StopSignal& stop) {
  return Agent(task, limits, model, tools, events, stop).run();
}

}  // namespace kiln::agent
