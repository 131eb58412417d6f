// The agent loop with the scripted model and the real tools (sandbox, files) on an example repo.
#include "agent/loop.h"

#include <gtest/gtest.h>

#include <thread>

#include "test_support.h"

namespace kiln::agent {
namespace {

using namespace std::chrono_literals;
using testing::call;
using testing::turn_with;
using testing::Workspace;

AgentTask stats_task() {
  return {"median() is wrong for lists of even length; fix it.", "stats-py", "python3 -m unittest -q", ""};
}

std::vector<std::string> kinds(const MemoryEventSink& sink) {
  std::vector<std::string> out;
  for (const auto& e : sink.events()) out.push_back(e.kind);
  return out;
}

TEST(AgentLoop, view_edit_test_submit_runs_real_tools_and_ends_submitted) {
  Workspace ws("stats-py");
  std::vector<ScriptedTurn> script;
  script.push_back(turn_with(call("view", Json{{"path", "stats.py"}}), "Let me look at stats.py first."));
  script.push_back(turn_with(testing::fix_median_call()));
  script.back().expect = [](const std::vector<Message>& seen) {
    ASSERT_EQ(seen.back().role, Role::tool);
    EXPECT_NE(seen.back().content.find("return ordered[middle]"), std::string::npos);  // the view result
  };
  script.push_back(turn_with(call("bash", Json{{"command", "python3 -m unittest -q"}})));
  script.push_back(turn_with(call("submit", Json{{"summary", "median averages the two middle values"}})));
  script.back().expect = [](const std::vector<Message>& seen) {
    EXPECT_NE(seen.back().content.find("OK"), std::string::npos) << seen.back().content;
    EXPECT_NE(seen.back().content.find("exit code 0"), std::string::npos) << seen.back().content;
  };
  ScriptedChatModel model(script);
  MemoryEventSink events;
  StopSignal stop;
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);

  EXPECT_EQ(r.reason, StopReason::submitted) << r.message;
  EXPECT_EQ(r.summary, "median averages the two middle values");
  EXPECT_EQ(r.counters.steps, 4);
  EXPECT_EQ(r.counters.tool_calls, 4);
  EXPECT_EQ(r.counters.tool_calls_by_name.at("str_replace"), 1);
  EXPECT_NE(testing::read_file(ws.workspace / "stats.py").find("ordered[middle - 1]"), std::string::npos);
  ASSERT_FALSE(r.transcript.empty());
  EXPECT_EQ(r.transcript.back().role, Role::exit);
  EXPECT_NE(r.transcript.back().content.find("submitted"), std::string::npos);
  // Prefill accounting: every token prefilled or generated once.
  EXPECT_EQ(r.counters.prefilled_tokens + r.counters.generated_tokens, r.counters.context_tokens);
  auto k = kinds(events);
  ASSERT_GE(k.size(), 3u);
  EXPECT_EQ(k.front(), "status");
  EXPECT_EQ(k[1], "reasoning");
  EXPECT_EQ(std::count(k.begin(), k.end(), "tool_call"), 4);
  EXPECT_EQ(std::count(k.begin(), k.end(), "tool_result"), 4);
}

TEST(AgentLoop, step_limit_ends_build_with_reason) {
  Workspace ws("stats-py");
  std::vector<ScriptedTurn> script;
  for (int i = 0; i < 5; ++i) script.push_back(turn_with(call("view", Json{{"path", i % 2 ? "stats.py" : "."}})));
  ScriptedChatModel model(script);
  MemoryEventSink events;
  StopSignal stop;
  Limits limits;
  limits.max_steps = 3;
  AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::step_limit);
  EXPECT_EQ(model.turns_used(), 3u);
  EXPECT_EQ(r.transcript.back().role, Role::exit);
  EXPECT_NE(r.transcript.back().content.find("step limit"), std::string::npos);
}

TEST(AgentLoop, token_limit_ends_build_mid_turn) {
  Workspace ws("stats-py");
  ScriptedTurn chatty = turn_with(call("view", Json{{"path", "."}}), std::string(400, 'r'));
  ScriptedChatModel model({chatty, chatty, chatty});
  MemoryEventSink events;
  StopSignal stop;
  Limits limits;
  limits.max_generated_tokens = 150;  // the second turn's 100+ reasoning tokens cross it
  AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::token_limit) << r.message;
  EXPECT_EQ(r.counters.generated_tokens, 150);
  EXPECT_EQ(model.turns_used(), 2u);
}

TEST(AgentLoop, wall_time_limit_interrupts_a_running_command) {
  Workspace ws("stats-py");
  ScriptedChatModel model({turn_with(call("bash", Json{{"command", "sleep 30"}}))});
  MemoryEventSink events;
  StopSignal stop;
  Limits limits;
  limits.max_wall_s = 1;
  auto t0 = std::chrono::steady_clock::now();
  AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::time_limit) << r.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// The scripted test model, made to wait before its first turn as EngineChatModel waits for engine
// memory: with `signal`, it reports the wait (waiting_for_memory ... memory_granted).
class ScriptedModelAfterAMemoryWait final : public ChatModel {
 public:
  ScriptedModelAfterAMemoryWait(ScriptedChatModel& scripted, std::chrono::milliseconds wait, bool signal)
      : scripted_(scripted), wait_(wait), signal_(signal) {}
  std::string name() const override { return scripted_.name(); }
  int64_t context_limit() const override { return scripted_.context_limit(); }
  Result<int64_t> prompt_tokens(const std::vector<Message>& conversation, const std::vector<ToolSchema>& tools) override {
    return scripted_.prompt_tokens(conversation, tools);
  }
  ModelTurn next_turn(const TurnRequest& request, const DeltaSink& on_delta, const std::atomic<bool>& cancel) override {
    double waited_s = 0;
    if (!waited_) {
      waited_ = true;
      if (signal_) on_delta({TurnDelta::Kind::waiting_for_memory, "context memory exhausted: …"});
      const auto start = std::chrono::steady_clock::now(), until = start + wait_;
      while (std::chrono::steady_clock::now() < until && !cancel.load()) std::this_thread::sleep_for(10ms);
      if (signal_) on_delta({TurnDelta::Kind::memory_granted, {}});
      if (signal_) waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (cancel.load()) {
        ModelTurn stopped;
        stopped.end = TurnEnd::cancelled;
        return stopped;
      }
    }
    ModelTurn turn = scripted_.next_turn(request, on_delta, cancel);
    turn.usage.wait_s += waited_s;
    return turn;
  }

 private:
  ScriptedChatModel& scripted_;
  const std::chrono::milliseconds wait_;
  const bool signal_;
  bool waited_ = false;
};

// Waiting for engine memory is not the build's time: the wall-time limit pauses over it. The
// same wait unreported is the build's time and ends it.
TEST(AgentLoop, wall_time_limit_pauses_while_the_engine_has_no_memory_for_the_build) {
  for (bool signal : {true, false}) {
    Workspace ws("stats-py");
    ScriptedChatModel scripted({turn_with(call("submit", Json{{"summary", "s"}}))});
    ScriptedModelAfterAMemoryWait model(scripted, 1500ms, signal);
    MemoryEventSink events;
    StopSignal stop;
    Limits limits;
    limits.max_wall_s = 1;
    AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
    EXPECT_EQ(r.reason, signal ? StopReason::submitted : StopReason::time_limit) << "signal " << signal << ": " << r.message;
    if (!signal) continue;
    EXPECT_GE(r.counters.wait_s, 1.4);  // the worker moves it into seconds_model_wait
    bool logged = false;
    for (const auto& e : events.events())
      if (e.kind == "metric" && e.payload.contains("step")) logged = e.payload.value("wait_s", 0.0) >= 1.4;
    EXPECT_TRUE(logged) << "the step's metric event should carry wait_s";
    int waiting_events = 0;
    for (const auto& e : events.events())
      waiting_events += e.kind == "status" && e.payload.value("phase", "") == "waiting_for_memory" &&
                        e.payload.value("message", "").find("context memory exhausted") != std::string::npos;
    EXPECT_EQ(waiting_events, 1);
  }
}

// A model that reports speculative decoding in its turns: the step's metric event carries it.
class ScriptedModelWithDrafts final : public ChatModel {
 public:
  explicit ScriptedModelWithDrafts(ScriptedChatModel& scripted) : scripted_(scripted) {}
  std::string name() const override { return scripted_.name(); }
  int64_t context_limit() const override { return scripted_.context_limit(); }
  Result<int64_t> prompt_tokens(const std::vector<Message>& c, const std::vector<ToolSchema>& t) override {
    return scripted_.prompt_tokens(c, t);
  }
  ModelTurn next_turn(const TurnRequest& request, const DeltaSink& on_delta, const std::atomic<bool>& cancel) override {
    ModelTurn turn = scripted_.next_turn(request, on_delta, cancel);
    turn.usage.draft_tokens = 12;
    turn.usage.draft_accepted = 9;
    return turn;
  }

 private:
  ScriptedChatModel& scripted_;
};

TEST(AgentLoop, the_step_metric_reports_draft_tokens_verified_and_accepted) {
  Workspace ws("stats-py");
  ScriptedChatModel scripted({turn_with(call("submit", Json{{"summary", "s"}}))});
  ScriptedModelWithDrafts model(scripted);
  MemoryEventSink events;
  StopSignal stop;
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::submitted) << r.message;
  int found = 0;
  for (const auto& e : events.events())
    if (e.kind == "metric" && e.payload.contains("step")) {
      EXPECT_EQ(e.payload.value("tokens_drafted", 0), 12);
      EXPECT_EQ(e.payload.value("tokens_draft_accepted", 0), 9);
      ++found;
    }
  EXPECT_EQ(found, 1);
}

TEST(AgentLoop, cancel_mid_tool_stops_within_a_second) {
  Workspace ws("stats-py");
  ScriptedChatModel model({turn_with(call("bash", Json{{"command", "sleep 30"}}))});
  MemoryEventSink events;
  StopSignal stop;
  std::chrono::steady_clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(500ms);
    cancelled_at = std::chrono::steady_clock::now();
    stop.request(StopCause::cancelled);
  });
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);
  auto ended = std::chrono::steady_clock::now();
  canceller.join();
  EXPECT_EQ(r.reason, StopReason::cancelled);
  EXPECT_LT(ended - cancelled_at, 1s);
  bool saw_cancelled_result = false;
  for (const auto& e : events.events())
    if (e.kind == "tool_result") saw_cancelled_result = e.payload["output"].get<std::string>().find("cancelled") != std::string::npos;
  EXPECT_TRUE(saw_cancelled_result);
}

TEST(AgentLoop, malformed_tool_call_returns_error_observation_and_three_end_the_build) {
  Workspace ws("stats-py");
  ScriptedTurn bad;
  bad.text = "<tool_call><function=view>";
  bad.call_errors = {"tool call 1 (view): unclosed <function=view>"};
  ScriptedTurn bad2 = bad, bad3 = bad;
  bad2.expect = [](const std::vector<Message>& seen) {
    EXPECT_EQ(seen.back().role, Role::tool);
    EXPECT_NE(seen.back().content.find("unclosed <function=view>"), std::string::npos);
  };
  ScriptedChatModel model({bad, bad2, bad3, turn_with(call("view", Json{{"path", "."}}))});
  MemoryEventSink events;
  StopSignal stop;
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::model_error);
  EXPECT_NE(r.message.find("3 malformed"), std::string::npos);
  EXPECT_EQ(model.turns_used(), 3u);
}

TEST(AgentLoop, a_good_call_resets_the_malformed_count) {
  Workspace ws("stats-py");
  ScriptedTurn bad;
  bad.call_errors = {"tool call 1: malformed"};
  ScriptedTurn no_call;
  no_call.text = "I think I am done.";
  ScriptedChatModel model({bad, no_call, turn_with(call("view", Json{{"path", "."}})), bad, no_call,
                           turn_with(call("submit", Json{{"summary", "s"}}))});
  MemoryEventSink events;
  StopSignal stop;
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::submitted) << r.message;
}

TEST(AgentLoop, loop_detection_warns_once_then_ends) {
  Workspace ws("stats-py");
  std::vector<ScriptedTurn> script(6, turn_with(call("view", Json{{"path", "stats.py"}})));
  script[3].expect = [](const std::vector<Message>& seen) {
    EXPECT_EQ(seen.back().role, Role::user);
    EXPECT_NE(seen.back().content.find("same `view` call 3 times"), std::string::npos);
  };
  ScriptedChatModel model(script);
  MemoryEventSink events;
  StopSignal stop;
  AgentResult r = run_agent(stats_task(), Limits{}, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::model_error);
  EXPECT_NE(r.message.find("loop"), std::string::npos);
  EXPECT_EQ(model.turns_used(), 4u);
  int warnings = 0;
  for (const auto& m : r.transcript) warnings += m.role == Role::user && m.content.find("same `view` call") != std::string::npos;
  EXPECT_EQ(warnings, 1);
}

TEST(AgentLoop, compaction_at_a_tiny_context_keeps_task_and_recent_turns) {
  Workspace ws("stats-py");
  std::vector<ScriptedTurn> script;
  for (const char* path : {"stats.py", "test_stats.py", "README.md", "stats.py", "test_stats.py"})
    script.push_back(turn_with(call("view", Json{{"path", path}})));
  script.push_back(turn_with(call("submit", Json{{"summary", "looked around"}})));
  script.back().expect = [](const std::vector<Message>& seen) {
    EXPECT_EQ(seen[1].content.rfind("median() is wrong", 0), 0u);  // the task is kept
    bool noted = false;
    for (const auto& m : seen) noted = noted || m.content.find("removed to fit the context") != std::string::npos;
    EXPECT_TRUE(noted);
  };
  ScriptedChatModel model(script, /*context_limit=*/1400);
  MemoryEventSink events;
  StopSignal stop;
  Limits limits;
  limits.min_turn_tokens = 100;
  limits.keep_recent_turns = 2;
  AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::submitted) << r.message;
  EXPECT_GE(r.counters.compactions, 1);
  int compactions = 0;
  for (const auto& e : events.events()) {
    if (e.kind != "compaction") continue;
    ++compactions;
    EXPECT_GT(e.payload["tokens_before"].get<int64_t>(), e.payload["tokens_after"].get<int64_t>());
    EXPECT_LE(e.payload["tokens_after"].get<int64_t>() + 100, 1400);
  }
  EXPECT_EQ(compactions, r.counters.compactions);
}

TEST(AgentLoop, context_that_cannot_be_compacted_ends_with_token_limit) {
  Workspace ws("stats-py");
  ScriptedChatModel model({turn_with(call("view", Json{{"path", "."}}))}, /*context_limit=*/300);
  MemoryEventSink events;
  StopSignal stop;
  Limits limits;
  limits.min_turn_tokens = 200;
  AgentResult r = run_agent(stats_task(), limits, model, *ws.executor, events, stop);
  EXPECT_EQ(r.reason, StopReason::token_limit);
  EXPECT_NE(r.message.find("context full"), std::string::npos);
  EXPECT_EQ(model.turns_used(), 0u);
}

}  // namespace
}  // namespace kiln::agent
