// The build pipeline end to end: real store (SQLite in a temp dir), real clone/branch/commit
// (libgit2), real sandbox and tools, the scripted model (or the engine on a make-tiny model).
#include "agent/worker.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "agent/engine_provider.h"
#include "agent/worker_pool.h"
#include "tools/git.h"
#include "test_support.h"

namespace kiln::agent {
namespace {

using namespace std::chrono_literals;
using store::BuildStatus;
using store::OutcomeReason;
using testing::call;
using testing::turn_with;

const char* kStatsTask = "median() in stats.py is wrong for lists of even length; fix it.";

struct Pipeline {
  testing::TempDir dir;
  testing::TestStore ts;
  std::filesystem::path source;
  WorkerOptions options;

  explicit Pipeline(const std::string& example, bool fake_clock = false) : ts(dir.path(), fake_clock) {
    source = dir.path() / "source";
    EXPECT_EQ(testing::make_example_repo(example, source), "");
    options.workspace_root = dir.path() / "workspaces";
    options.heartbeat_interval = 50ms;
    options.owner = "test";
  }

  store::Build submit(std::optional<std::string> verify, store::Limits limits = {}, std::string model = "scripted") {
    store::BuildSpec spec;
    spec.repo = source.string();
    spec.task = kStatsTask;
    spec.verify = std::move(verify);
    spec.model = std::move(model);
    spec.limits = limits;
    auto submitted = ts.store->submit(spec);
    EXPECT_TRUE(submitted.ok()) << submitted.error().message;
    return submitted.value();
  }

  store::Build claim() {
    auto claimed = ts.store->claim({"test/worker-0", options.lease_ms, {}});
    EXPECT_TRUE(claimed.ok() && claimed.value().has_value());
    return *claimed.value();
  }

  std::vector<store::Event> events(int64_t id) {
    auto e = ts.store->read_events(id, 0, 10000);
    EXPECT_TRUE(e.ok());
    return e.ok() ? e.value() : std::vector<store::Event>{};
  }

  std::filesystem::path workspace(int64_t id) const { return build_workspace(options.workspace_root, id); }
};

ModelProvider scripted(std::vector<ScriptedTurn> script) {
  return [script](const std::string& model, int64_t) -> Result<std::unique_ptr<ChatModel>> {
    if (model != "scripted") return Error{"unknown model " + model};
    return std::unique_ptr<ChatModel>(std::make_unique<ScriptedChatModel>(script));
  };
}

std::vector<ScriptedTurn> fixing_script() {
  return {turn_with(call("view", Json{{"path", "stats.py"}}), "Look at median first."),
          turn_with(testing::fix_median_call()),
          turn_with(call("bash", Json{{"command", "python3 -m unittest -q"}})),
          turn_with(call("submit", Json{{"summary", "median averages the middle pair"}}))};
}

// Index of the first event at or after `from` whose kind matches and whose payload contains `text`.
size_t find_event(const std::vector<store::Event>& events, size_t from, std::string_view kind, std::string_view text) {
  for (size_t i = from; i < events.size(); ++i)
    if (events[i].kind == kind && events[i].payload_json.find(text) != std::string::npos) return i;
  return events.size();
}

TEST(BuildPipeline, successful_build_is_verified_committed_and_recorded) {
  Pipeline p("stats-py");
  p.options.keep_workspaces = true;
  auto submitted = p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(fixing_script()), stop);
  ASSERT_TRUE(report.finished) << report.message;
  EXPECT_EQ(report.status, BuildStatus::succeeded) << report.message;
  EXPECT_EQ(report.reason, OutcomeReason::verified);

  auto stored = p.ts.store->get(build.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status, BuildStatus::succeeded);
  EXPECT_EQ(stored->outcome, OutcomeReason::verified);
  EXPECT_EQ(stored->result_branch, "kiln/" + std::to_string(build.id));
  ASSERT_TRUE(stored->result_diff.has_value());
  EXPECT_NE(stored->result_diff->find("+        return (ordered[middle - 1] + ordered[middle]) / 2"), std::string::npos);
  EXPECT_EQ(stored->result_diff->find("__pycache__"), std::string::npos);
  const auto& m = stored->metrics;
  EXPECT_EQ(m.steps, 4);
  EXPECT_EQ(m.tool_calls.at("view"), 1);
  EXPECT_EQ(m.tool_calls.at("str_replace"), 1);
  EXPECT_EQ(m.tool_calls.at("bash"), 1);
  EXPECT_GT(m.tokens_generated, 0);
  EXPECT_GT(m.tokens_prefilled, 0);
  EXPECT_GT(m.seconds_verify, 0);
  EXPECT_GT(m.seconds_tools, 0);
  EXPECT_GE(m.seconds_wall, m.seconds_setup + m.seconds_tools + m.seconds_verify);

  // The branch holds one new commit whose message is the task.
  std::string ws = p.workspace(build.id).string();
  EXPECT_EQ(testing::capture("git -c safe.directory='*' -C '" + ws + "' rev-parse --abbrev-ref HEAD"), "kiln/" + std::to_string(build.id) + "\n");
  EXPECT_EQ(testing::capture("git -c safe.directory='*' -C '" + ws + "' log --format=%B -1"), std::string(kStatsTask) + "\n");
  EXPECT_EQ(testing::capture("git -c safe.directory='*' -C '" + ws + "' rev-list --count HEAD"), "2\n");
  EXPECT_EQ(testing::capture("git -c safe.directory='*' -C '" + ws + "' rev-parse HEAD"), report.commit + "\n");

  // Events in order: setup, agent (reasoning, the four calls), commit, verify, metrics.
  auto events = p.events(build.id);
  size_t i = find_event(events, 0, "status", "\"setup\"");
  i = find_event(events, i, "status", "\"agent\"");
  i = find_event(events, i, "reasoning", "Look at median");
  for (const char* tool : {"view", "str_replace", "bash", "submit"}) {
    i = find_event(events, i, "tool_call", tool);
    i = find_event(events, i, "tool_result", tool);
  }
  i = find_event(events, i, "status", "\"commit\"");
  i = find_event(events, i, "log", report.commit);
  i = find_event(events, i, "status", "\"verify\"");
  i = find_event(events, i, "log", "\"exit_code\":0");
  i = find_event(events, i, "metric", "seconds_wall");
  EXPECT_LT(i, events.size()) << "events out of order or missing";
}

// Waiting for the model (its first load, a free engine session) is server load, not the build's
// time: it is recorded apart and kept out of setup and wall time, which compare ranks.
TEST(BuildPipeline, waiting_for_the_model_is_recorded_apart_from_the_builds_time) {
  Pipeline p("stats-py");
  p.submit(std::nullopt);
  auto build = p.claim();
  StopSignal stop;
  ModelProvider inner = scripted({turn_with(call("submit", Json{{"summary", "nothing to do"}}))});
  ModelProvider slow = [inner](const std::string& model, int64_t id) {
    std::this_thread::sleep_for(400ms);  // a load, or another build holding the only session
    return inner(model, id);
  };
  const auto t0 = std::chrono::steady_clock::now();
  BuildReport report = run_build(*p.ts.store, build, p.options, slow, stop);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(report.finished) << report.message;
  auto stored = p.ts.store->get(build.id);
  ASSERT_TRUE(stored.ok());
  const auto& m = stored->metrics;
  EXPECT_GE(m.seconds_model_wait, 0.4);
  EXPECT_LT(m.seconds_setup, 0.4);
  EXPECT_LE(m.seconds_wall + m.seconds_model_wait, elapsed + 0.01);
  EXPECT_LT(m.seconds_wall, elapsed - 0.35);
}

// A build that generates megabytes of files: the commit keeps them all, the stored diff is cut
// with a note naming the branch (it is read by the API, the page and every outcome read).
TEST(BuildPipeline, a_huge_diff_is_stored_cut_with_a_note) {
  Pipeline p("stats-py");
  p.submit(std::nullopt);
  auto build = p.claim();
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{
      turn_with(call("bash", Json{{"command", "head -c 9000000 /dev/zero | tr '\\0' a | fold -w 99 > big.txt"}})),
      turn_with(call("submit", Json{{"summary", "generated"}}))};
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  auto stored = p.ts.store->get(build.id);
  ASSERT_TRUE(stored.ok());
  const std::string diff = stored->result_diff.value_or("");
  EXPECT_LE(diff.size(), (8u << 20) + 200);
  EXPECT_GE(diff.size(), 8u << 19);
  EXPECT_NE(diff.find("[kiln: diff cut at "), std::string::npos);
  EXPECT_NE(diff.find("the whole change is on branch kiln/" + std::to_string(build.id)), std::string::npos);
  EXPECT_FALSE(report.commit.empty());
}

TEST(BuildPipeline, failing_verify_ends_failed_with_verify_failed) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "nothing to do"}}))};
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::failed);
  EXPECT_EQ(stored->outcome, OutcomeReason::verify_failed);
  EXPECT_NE(stored->error_message.value_or("").find("exit code"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(p.workspace(build.id)));  // cleaned up
}

TEST(BuildPipeline, step_limit_from_the_build_spec_ends_failed_step_limit) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q", store::Limits{2, 0, 0});
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(fixing_script()), stop);
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::failed);
  EXPECT_EQ(stored->outcome, OutcomeReason::step_limit);
  EXPECT_EQ(stored->metrics.steps, 2);
  // The partial work (the fix, made in step 2) is still committed on the branch for inspection.
  EXPECT_NE(stored->result_diff.value_or("").find("ordered[middle - 1]"), std::string::npos);
}

TEST(BuildPipeline, cancel_in_the_store_stops_a_running_command_within_a_second) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  std::chrono::steady_clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(800ms);
    cancelled_at = std::chrono::steady_clock::now();
    EXPECT_TRUE(p.ts.store->cancel(build.id).ok());
  });
  auto script = std::vector<ScriptedTurn>{turn_with(call("bash", Json{{"command", "sleep 30"}}))};
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  auto ended = std::chrono::steady_clock::now();
  canceller.join();
  EXPECT_LT(ended - cancelled_at, 1s);
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::cancelled);
  EXPECT_EQ(stored->outcome, OutcomeReason::cancelled);
}

TEST(BuildPipeline, clone_failure_is_an_infra_error_naming_the_repo) {
  Pipeline p("stats-py");
  store::BuildSpec spec;
  spec.repo = (p.dir.path() / "no-such-repo").string();
  spec.task = "anything";
  spec.model = "scripted";
  ASSERT_TRUE(p.ts.store->submit(spec).ok());
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted({}), stop);
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::error);
  EXPECT_EQ(stored->outcome, OutcomeReason::infra_error);
  EXPECT_NE(stored->error_message.value_or("").find("no-such-repo"), std::string::npos);
}

// A repository that tracks `.kiln` (kiln's own directory in the workspace) is refused at setup
// with the reason, before the model runs: building it would have committed the deletion of the
// user's file as if the agent had made it.
TEST(BuildPipeline, a_repository_tracking_dot_kiln_is_refused_at_setup) {
  Pipeline p("stats-py");
  const std::string git = "git -C '" + p.source.string() + "' -c user.name=t -c user.email=t@t ";
  std::ofstream(p.source / ".kiln") << "the user's own\n";
  ASSERT_EQ(testing::shell(git + "add -A && " + git + "commit -qm 'track .kiln' >/dev/null"), 0);
  p.submit(std::nullopt);
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted({}), stop);
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::error);
  EXPECT_EQ(stored->outcome, OutcomeReason::infra_error);
  EXPECT_NE(stored->error_message.value_or("").find("tracks `.kiln`"), std::string::npos) << stored->error_message.value_or("");
  EXPECT_TRUE(report.commit.empty());
  EXPECT_EQ(testing::capture("git -C '" + (p.dir.path() / "results.git").string() + "' branch --list 'kiln/*' 2>/dev/null"), "");
}

TEST(BuildPipeline, unknown_model_is_a_model_error) {
  Pipeline p("stats-py");
  p.submit(std::nullopt, {}, "nonexistent");
  auto build = p.claim();
  StopSignal stop;
  run_build(*p.ts.store, build, p.options, scripted({}), stop);
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::error);
  EXPECT_EQ(stored->outcome, OutcomeReason::model_error);
  EXPECT_NE(stored->error_message.value_or("").find("nonexistent"), std::string::npos);
}

// Attempt 1 of `build`: the median fix, then the worker shuts down during its next turn.
BuildReport fix_then_shut_down(Pipeline& p, const store::Build& build) {
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{turn_with(testing::fix_median_call()),
                                          turn_with(call("view", Json{{"path", "."}}))};
  script[1].expect = [&](const std::vector<Message>&) { stop.request(StopCause::shutdown); };
  return run_build(*p.ts.store, build, p.options, scripted(script), stop);
}

// Attempt 1 edits, then the worker shuts down mid-build; the lease expires, recovery requeues,
// attempt 2 is told and continues from the workspace attempt 1 left.
TEST(BuildPipeline, interrupted_build_resumes_from_its_workspace) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  p.submit("python3 -m unittest -q");
  auto first = p.claim();
  BuildReport r1 = fix_then_shut_down(p, first);
  EXPECT_FALSE(r1.finished);
  EXPECT_TRUE(std::filesystem::exists(p.workspace(first.id)));  // kept for the next attempt

  p.ts.clock->fetch_add(10'000);
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  ASSERT_EQ(second.attempt, 2);
  StopSignal stop2;
  auto script2 = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "already fixed"}}))};
  script2[0].expect = [](const std::vector<Message>& seen) {
    EXPECT_NE(seen[1].content.find("the workspace keeps its changes (1 files changed)"), std::string::npos) << seen[1].content;
  };
  BuildReport r2 = run_build(*p.ts.store, second, p.options, scripted(script2), stop2);
  ASSERT_TRUE(r2.finished) << r2.message;
  EXPECT_EQ(r2.status, BuildStatus::succeeded) << r2.message;
  auto events = p.events(first.id);
  EXPECT_LT(find_event(events, 0, "log", "\"from\":\"workspace\""), events.size());
  // The build's totals include what the interrupted attempt spent (two model turns, one tool call).
  auto stored = p.ts.store->get(first.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->metrics.steps, 3) << store::to_json(stored->metrics);
  EXPECT_EQ(stored->metrics.tool_calls["str_replace"], 1) << store::to_json(stored->metrics);
}

// Attempt 1 got as far as committing its change before it was cut off: attempt 2 is told the
// change is there (counted against the base, not HEAD) and reports that commit instead of failing
// with "nothing to commit".
TEST(BuildPipeline, resumed_build_whose_change_was_already_committed_reports_that_commit) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  p.submit("python3 -m unittest -q");
  auto first = p.claim();
  BuildReport r1 = fix_then_shut_down(p, first);
  ASSERT_FALSE(r1.finished);
  auto committed = tools::git_commit_all(p.workspace(first.id), "attempt 1");  // as its commit phase would
  ASSERT_TRUE(committed.ok()) << committed.error;

  p.ts.clock->fetch_add(10'000);
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  StopSignal stop2;
  auto script2 = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "already fixed"}}))};
  script2[0].expect = [](const std::vector<Message>& seen) {
    EXPECT_NE(seen[1].content.find("(1 files changed)"), std::string::npos) << seen[1].content;
  };
  BuildReport r2 = run_build(*p.ts.store, second, p.options, scripted(script2), stop2);
  ASSERT_TRUE(r2.finished) << r2.message;
  EXPECT_EQ(r2.status, BuildStatus::succeeded) << r2.message;
  EXPECT_EQ(r2.commit, committed.value);
  auto events = p.events(first.id);
  EXPECT_EQ(find_event(events, 0, "error", "commit"), events.size());
  EXPECT_LT(find_event(events, 0, "log", "already committed by an earlier attempt"), events.size());
  EXPECT_NE(p.ts.store->get(first.id)->result_diff.value_or("").find("stats.py"), std::string::npos);
}

// An attempt that died without writing its totals (killed: no shutdown path ran) still logged its
// steps: the next attempt adds them to the build's metrics, so a resumed build is compared with
// everything it spent. (A graceful stop writes its totals; the test above checks they are not
// counted twice.)
TEST(BuildPipeline, a_killed_attempts_metrics_are_recovered_from_its_log) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  p.submit(std::nullopt);
  auto first = p.claim();
  const std::vector<store::NewEvent> logged = {
      {"metric", R"({"step":1,"tokens_prefilled":900,"tokens_reused":0,"tokens_generated":40,"tokens_reasoning":30,"prefill_s":2.5,"decode_s":1.0,"wait_s":4.0})"},
      {"tool_call", R"({"name":"bash","arguments":{"command":"ls"}})"},
      {"metric", R"({"step":2,"tokens_prefilled":60,"tokens_reused":940,"tokens_generated":20,"tokens_reasoning":0,"prefill_s":0.5,"decode_s":0.5})"},
      {"tool_call", R"({"name":"view","arguments":{"path":"stats.py"}})"}};
  ASSERT_TRUE(p.ts.store->append_events(first.id, first.attempt, logged).ok());
  p.ts.clock->fetch_add(10'000);  // the worker died: its lease lapses
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  ASSERT_EQ(second.attempt, 2);
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "done"}}))};
  BuildReport r = run_build(*p.ts.store, second, p.options, scripted(script), stop);
  ASSERT_TRUE(r.finished) << r.message;
  auto stored = p.ts.store->get(first.id);
  ASSERT_TRUE(stored.ok());
  const store::BuildMetrics& m = stored->metrics;
  EXPECT_EQ(m.steps, 3) << store::to_json(m);  // two recovered + the one of attempt 2
  EXPECT_GE(m.tokens_prefilled, 960);
  EXPECT_GE(m.tokens_cached, 940);
  EXPECT_GE(m.tokens_generated, 60);
  EXPECT_GE(m.seconds_prefill, 3.0);
  EXPECT_GE(m.seconds_model_wait, 4.0);  // its wait for engine memory: not the build's own time
  EXPECT_EQ(m.tool_calls.at("bash"), 1);
  EXPECT_EQ(m.tool_calls.at("view"), 1);
  auto events = p.events(first.id);
  EXPECT_LT(find_event(events, 0, "log", "metrics of attempt 1 recovered from its log"), events.size());
}

TEST(BuildPipeline, interrupted_build_without_workspace_says_it_restarts_from_scratch) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  p.submit("python3 -m unittest -q");
  auto first = p.claim();
  p.ts.clock->fetch_add(10'000);  // attempt 1 died before creating its workspace
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  StopSignal stop;
  BuildReport r = run_build(*p.ts.store, second, p.options, scripted(fixing_script()), stop);
  EXPECT_EQ(r.status, BuildStatus::succeeded) << r.message;
  auto events = p.events(first.id);
  EXPECT_LT(find_event(events, 0, "log", "\"from\":\"scratch\""), events.size());
}

// The real engine on a random-weight model: its output is noise, so the build ends by a limit;
// the pipeline, the session reuse and the accounting are what is checked.
TEST(BuildPipeline, engine_build_on_a_tiny_model_runs_end_to_end_and_ends_by_a_limit) {
  Pipeline p("stats-py");
  testing::TinyEngine tiny;
  ASSERT_TRUE(tiny.model && tiny.tokenizer);
  EngineChatModelOptions model_options;
  model_options.sampling.temperature = 1.0f;
  model_options.sampling.seed = 3;
  auto provider = engine_model_provider({{"tiny", {tiny.model.get(), tiny.tokenizer.get(), model_options}}});
  p.options.limits.max_format_errors = 1000;  // noise is never a valid call; let the step limit end it
  p.options.limits.max_turn_tokens = 24;
  p.submit("python3 -m unittest -q", store::Limits{4, 0, 0}, "tiny");
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, provider, stop);
  ASSERT_TRUE(report.finished) << report.message;
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::failed);
  EXPECT_EQ(stored->outcome, OutcomeReason::step_limit) << stored->error_message.value_or("");
  EXPECT_EQ(stored->metrics.steps, 4);
  EXPECT_GT(stored->metrics.tokens_generated, 0);
  EXPECT_GT(stored->metrics.tokens_cached, stored->metrics.tokens_prefilled);  // turns 2..4 reuse the session
  EXPECT_GT(stored->metrics.seconds_decode, 0);

  // Per-turn metric events: every token of the session was prefilled or generated exactly once.
  int64_t prefilled = 0, generated = 0, context = 0, turns = 0;
  for (const auto& e : p.events(build.id)) {
    if (e.kind != "metric") continue;
    auto j = Json::parse(e.payload_json);
    if (!j.contains("step") || !j.contains("context_tokens") || j.contains("steps")) continue;
    ++turns;
    prefilled += j["tokens_prefilled"].get<int64_t>();
    generated += j["tokens_generated"].get<int64_t>();
    context = j["context_tokens"].get<int64_t>();
  }
  EXPECT_EQ(turns, 4);
  EXPECT_EQ(prefilled + generated, context);
  EXPECT_EQ(prefilled, stored->metrics.tokens_prefilled);
}

std::string git_in(const std::filesystem::path& repo, const std::string& args) {
  return testing::capture("git -c safe.directory='*' -C '" + repo.string() + "' " + args);
}

// The result branch outlives the workspace: it is pushed into <var>/results.git (next to the
// workspaces directory) and the final event says where; binary changes are in the stored diff.
TEST(BuildPipeline, the_result_branch_is_kept_in_the_results_repository) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  auto script = fixing_script();
  script.insert(script.begin(), turn_with(call("bash", Json{{"command", "printf 'a\\000\\001\\377b' > blob.bin"}})));
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  EXPECT_EQ(report.status, BuildStatus::succeeded) << report.message;
  const std::filesystem::path results = p.dir.path() / "results.git";
  EXPECT_EQ(report.results_repo, results.string());
  EXPECT_FALSE(std::filesystem::exists(p.workspace(build.id)));  // removed; the branch is not lost
  const std::string branch = "kiln/" + std::to_string(build.id);
  EXPECT_EQ(git_in(results, "rev-parse " + branch), report.commit + "\n");
  EXPECT_NE(git_in(results, "show " + branch + ":stats.py").find("ordered[middle - 1]"), std::string::npos);
  auto events = p.events(build.id);
  EXPECT_LT(find_event(events, 0, "log", "\"results_repo\":\"" + results.string() + "\""), events.size());
  EXPECT_NE(p.ts.store->get(build.id)->result_diff.value_or("").find("GIT binary patch"), std::string::npos);
}

// A commit that fails is not a success without a commit: the build ends infra_error naming why.
TEST(BuildPipeline, a_failed_commit_is_an_infra_error_naming_the_cause) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  auto script = fixing_script();
  script.back().expect = [&](const std::vector<Message>&) {  // break the index before the commit
    std::filesystem::remove(p.workspace(build.id) / ".git/index");
    std::filesystem::create_directories(p.workspace(build.id) / ".git/index/x");
  };
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  auto stored = p.ts.store->get(build.id);
  EXPECT_EQ(stored->status, BuildStatus::error);
  EXPECT_EQ(stored->outcome, OutcomeReason::infra_error);
  EXPECT_NE(stored->error_message.value_or("").find("commit failed"), std::string::npos) << stored->error_message.value_or("");
}

// A kiln killed mid-commit leaves .git/index.lock; kiln is the only writer of .git, so the next
// commit removes it instead of failing.
TEST(BuildPipeline, a_stale_index_lock_is_removed_before_committing) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  auto script = fixing_script();
  script.back().expect = [&](const std::vector<Message>&) {
    std::ofstream(p.workspace(build.id) / ".git/index.lock") << "";
  };
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  EXPECT_EQ(report.status, BuildStatus::succeeded) << report.message;
  EXPECT_FALSE(report.commit.empty());
  auto events = p.events(build.id);
  EXPECT_LT(find_event(events, 0, "log", "stale .git/index.lock"), events.size());
}

// The agent ran `git init` in a subdirectory: that directory is skipped (and named), the rest of
// the change is committed.
TEST(BuildPipeline, a_nested_repository_is_skipped_and_the_rest_committed) {
  Pipeline p("stats-py");
  p.submit("python3 -m unittest -q");
  auto build = p.claim();
  StopSignal stop;
  auto script = fixing_script();
  script.insert(script.begin(), turn_with(call("bash", Json{{"command", "mkdir tool && cd tool && git init -q && echo x > f"}})));
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(script), stop);
  ASSERT_TRUE(report.finished) << report.message;
  EXPECT_EQ(report.status, BuildStatus::succeeded) << report.message;
  ASSERT_FALSE(report.commit.empty());
  EXPECT_EQ(git_in(p.dir.path() / "results.git", "show --name-only --format= " + report.commit), "stats.py\n");
  auto events = p.events(build.id);
  EXPECT_LT(find_event(events, 0, "log", "\"skipped\":[\"tool/\"]"), events.size());
}

// Attempt 1 submitted, committed, and was stopped while verify ran (verify had written a file).
// Attempt 2 re-runs only verify, on the committed tree: verify's output is never committed.
TEST(BuildPipeline, a_build_interrupted_during_verify_reruns_verify_on_the_committed_tree) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  // Fails when an earlier verify's output is still there.
  p.submit("test ! -e verify-out.txt && touch verify-out.txt && sleep 2 && python3 -m unittest -q");
  auto first = p.claim();
  StopSignal stop1;
  std::thread stopper([&] {
    for (int i = 0; i < 200 && !std::filesystem::exists(p.workspace(first.id) / "verify-out.txt"); ++i)
      std::this_thread::sleep_for(50ms);
    stop1.request(StopCause::shutdown);
  });
  BuildReport r1 = run_build(*p.ts.store, first, p.options, scripted(fixing_script()), stop1);
  stopper.join();
  ASSERT_FALSE(r1.finished) << r1.message;
  ASSERT_TRUE(std::filesystem::exists(p.workspace(first.id) / "verify-out.txt"));

  p.ts.clock->fetch_add(10'000);
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  ASSERT_EQ(second.attempt, 2);
  StopSignal stop2;
  BuildReport r2 = run_build(*p.ts.store, second, p.options, scripted({}), stop2);  // no model turn
  ASSERT_TRUE(r2.finished) << r2.message;
  EXPECT_EQ(r2.status, BuildStatus::succeeded) << r2.message;
  EXPECT_EQ(r2.reason, OutcomeReason::verified);
  const std::string branch = "kiln/" + std::to_string(first.id);
  EXPECT_EQ(git_in(p.dir.path() / "results.git", "ls-tree -r --name-only " + branch).find("verify-out.txt"),
            std::string::npos);
  EXPECT_EQ(r2.commit, r1.commit.empty() ? git_in(p.dir.path() / "results.git", "rev-parse " + branch).substr(0, 40) : r1.commit);
  EXPECT_EQ(p.ts.store->get(first.id)->result_diff.value_or("").find("verify-out.txt"), std::string::npos);
  auto events = p.events(first.id);
  EXPECT_LT(find_event(events, 0, "log", "\"from\":\"verify\""), events.size());
}

// Attempt 2 recovered attempt 1's metrics, then died too: attempt 3 must not add attempt 1 again.
// A dead attempt's wall time ends at its own last event, not at the requeue recovery wrote later.
TEST(BuildPipeline, recovered_metrics_are_counted_once_and_exclude_downtime) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.options.lease_ms = 1'000;
  p.submit(std::nullopt);
  auto first = p.claim();
  const std::vector<store::NewEvent> logged = {
      {"metric", R"({"step":1,"tokens_prefilled":900000,"tokens_reused":0,"tokens_generated":40,"tokens_reasoning":0,"prefill_s":2.5,"decode_s":1.0})"},
      {"tool_call", R"({"name":"bash","arguments":{"command":"ls"}})"}};
  ASSERT_TRUE(p.ts.store->append_events(first.id, first.attempt, logged).ok());
  p.ts.clock->fetch_add(100'000);  // the server is down for 100 s before recovery runs
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto second = p.claim();
  {
    StopSignal stop;  // attempt 2 recovers attempt 1, then loses its lease (dies) in its first turn
    auto script = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "done"}}))};
    script[0].expect = [&](const std::vector<Message>&) { stop.request(StopCause::lease_lost); };
    BuildReport r = run_build(*p.ts.store, second, p.options, scripted(script), stop);
    ASSERT_FALSE(r.finished);
  }
  p.ts.clock->fetch_add(10'000);
  ASSERT_TRUE(p.ts.store->recover().ok());
  auto third = p.claim();
  ASSERT_EQ(third.attempt, 3);
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "done"}}))};
  BuildReport r = run_build(*p.ts.store, third, p.options, scripted(script), stop);
  ASSERT_TRUE(r.finished) << r.message;
  auto stored = p.ts.store->get(first.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_GE(stored->metrics.tokens_prefilled, 900'000);
  EXPECT_LT(stored->metrics.tokens_prefilled, 1'800'000) << "attempt 1 counted twice";
  EXPECT_EQ(stored->metrics.tool_calls["bash"], 1);
  EXPECT_LT(stored->metrics.seconds_wall, 50.0) << "server downtime counted as build time";
  int recovered = 0;
  for (const auto& e : p.events(first.id))
    if (e.kind == "log" && e.payload_json.find("metrics of attempt 1 recovered") != std::string::npos) ++recovered;
  EXPECT_EQ(recovered, 1);
}

// A graceful shutdown hands the build back at once; restarts do not use up its attempts (three
// used to end a healthy build with "lease expired on 3 attempts").
TEST(BuildPipeline, shutdown_requeues_the_build_at_once_without_using_an_attempt) {
  Pipeline p("stats-py", /*fake_clock=*/true);
  p.submit("python3 -m unittest -q");
  int64_t id = 0;
  for (int restart = 1; restart <= 3; ++restart) {
    auto build = p.claim();
    id = build.id;
    BuildReport r = fix_then_shut_down(p, build);
    ASSERT_FALSE(r.finished);
    auto stored = p.ts.store->get(id);
    EXPECT_EQ(stored->status, BuildStatus::queued) << "restart " << restart;
    p.ts.clock->fetch_add(60'000);
    ASSERT_TRUE(p.ts.store->recover().ok());
  }
  auto last = p.claim();
  EXPECT_EQ(last.attempt, 4);
  StopSignal stop;
  auto script = std::vector<ScriptedTurn>{turn_with(call("submit", Json{{"summary", "fixed"}}))};
  BuildReport r = run_build(*p.ts.store, last, p.options, scripted(script), stop);
  ASSERT_TRUE(r.finished) << r.message;
  EXPECT_EQ(r.status, BuildStatus::succeeded) << r.message;
}

// Workspaces of builds that ended without their worker removing them (given up or cancelled by
// recovery, cancelled while queued after an interrupted attempt, a crash after finish) and of
// builds the store does not know are swept; those of queued/running builds stay. Read-only
// directories a command left do not stop it.
TEST(BuildPipeline, sweep_removes_workspaces_of_ended_and_unknown_builds) {
  Pipeline p("stats-py");
  int64_t cancelled = p.submit(std::nullopt).id;
  int64_t queued = p.submit(std::nullopt).id;
  ASSERT_TRUE(p.ts.store->cancel(cancelled).ok());
  for (int64_t id : {cancelled, queued, int64_t{999}}) {
    std::filesystem::create_directories(p.workspace(id) / "ro/sub");
    std::ofstream(p.workspace(id) / "ro/sub/f") << "x";
    std::filesystem::permissions(p.workspace(id) / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  }
  std::filesystem::create_directories(p.options.workspace_root / "not-a-build");
  EXPECT_EQ(sweep_workspaces(*p.ts.store, p.options.workspace_root), 2);
  EXPECT_FALSE(std::filesystem::exists(p.workspace(cancelled)));
  EXPECT_FALSE(std::filesystem::exists(p.workspace(999)));
  EXPECT_TRUE(std::filesystem::exists(p.workspace(queued)));
  EXPECT_TRUE(std::filesystem::exists(p.options.workspace_root / "not-a-build"));
  // The pool sweeps when it starts.
  ASSERT_TRUE(p.ts.store->cancel(queued).ok());
  WorkerPool pool(p.options, *p.ts.store, scripted({}), 1);
  pool.start();
  pool.stop();
  EXPECT_FALSE(std::filesystem::exists(p.workspace(queued)));
}

// A workspace kept because the push of its result failed holds the only copy of the branch: the
// sweep leaves it, though the build has ended.
TEST(BuildPipeline, a_workspace_kept_after_a_failed_push_survives_the_sweep) {
  Pipeline p("stats-py");
  std::ofstream(p.dir.path() / "not-a-dir") << "x";
  p.options.results_repo = p.dir.path() / "not-a-dir" / "results.git";  // cannot be created
  p.submit(std::nullopt);
  auto build = p.claim();
  StopSignal stop;
  BuildReport report = run_build(*p.ts.store, build, p.options, scripted(fixing_script()), stop);
  ASSERT_TRUE(report.finished) << report.message;
  EXPECT_EQ(report.reason, OutcomeReason::infra_error) << report.message;
  ASSERT_TRUE(std::filesystem::exists(p.workspace(build.id)));
  EXPECT_EQ(sweep_workspaces(*p.ts.store, p.options.workspace_root), 0);
  EXPECT_TRUE(std::filesystem::exists(p.workspace(build.id)));
}

// Stopping a pool hands a running build back once: idle workers do not claim it again only to
// stop it (each claim would be another attempt, and a model load or wait).
TEST(WorkerPool, a_build_handed_back_at_stop_is_not_claimed_again_by_idle_workers) {
  Pipeline p("stats-py");
  int64_t id = p.submit(std::nullopt).id;
  WorkerPool pool(p.options, *p.ts.store, scripted({turn_with(call("bash", Json{{"command", "sleep 20"}}))}), 3);
  pool.start();
  auto until = std::chrono::steady_clock::now() + 20s;
  while (pool.busy() < 1 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(500ms);  // inside the command
  pool.stop();
  auto stored = p.ts.store->get(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status, BuildStatus::queued);
  EXPECT_EQ(stored->attempt, 1);
}

TEST(WorkerPool, carries_queued_builds_to_an_outcome_and_stops) {
  Pipeline p("stats-py");
  int64_t a = p.submit("python3 -m unittest -q").id;
  int64_t b = p.submit(std::nullopt).id;
  WorkerPool pool(p.options, *p.ts.store, scripted(fixing_script()), 2);
  pool.start();
  auto until = std::chrono::steady_clock::now() + 30s;
  while (pool.builds_done() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  pool.stop();
  EXPECT_EQ(p.ts.store->get(a)->outcome, OutcomeReason::verified);
  EXPECT_EQ(p.ts.store->get(b)->outcome, OutcomeReason::no_verify);
}

}  // namespace
}  // namespace kiln::agent
