#include "agent/worker.h"

#include <algorithm>
#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>

#include "agent/lease.h"
#include "agent/loop.h"
#include "agent/store_events.h"
#include "agent/tools_adapter.h"
#include "tools/tools.h"

namespace kiln::agent {

namespace {

// In a workspace kept because it holds the only copy of its result (the push to the results
// repository failed): sweep_workspaces leaves it for a person to recover.
std::filesystem::path keep_marker(const std::filesystem::path& workspace) { return workspace / ".git" / "kiln-keep"; }
constexpr size_t kMaxStoredDiffBytes = 8u << 20;  // the diff kept with a build's outcome
constexpr const char* kWorkspacePrefix = "build-";  // build_workspace(): build-<id>
std::mutex g_sandbox_failures_mu;
std::map<std::string, int64_t> g_sandbox_failures;  // guarded by g_sandbox_failures_mu
}  // namespace

std::map<std::string, int64_t> sandbox_failure_counts() {
  std::lock_guard lock(g_sandbox_failures_mu);
  return g_sandbox_failures;
}

void count_sandbox_failure(const std::string& reason) {
  std::lock_guard lock(g_sandbox_failures_mu);
  ++g_sandbox_failures[reason];
}

std::string sandbox_failure_reason(const nlohmann::json& r) {
  if (!r.is_object() || !r.contains("exit_code")) return "";
  if (r.contains("error") && r["error"].is_string() && !r["error"].get<std::string>().empty()) return "start_failed";
  if (r.value("ok", true) == false) return "start_failed";
  if (r.value("cancelled", false)) return "";
  if (r.value("timed_out", false)) return "wall_timeout";
  int code = r.value("exit_code", 0), sig = r.value("signal", 0);
  if (code == 128 + SIGXCPU || sig == SIGXCPU) return "cpu_limit";
  if (code == 128 + SIGXFSZ || sig == SIGXFSZ) return "file_size_limit";
  if (code == 128 + SIGKILL || sig == SIGKILL) return "killed";
  return "";
}

namespace {

// Counts the sandbox failures of the commands the model runs (the bash tool's result data is the
// sandbox result, or {"infra_error", "sandbox": result} when the sandbox failed).
class CountingToolExecutor final : public ToolExecutor {
 public:
  explicit CountingToolExecutor(ToolExecutor& inner) : inner_(inner) {}
  std::vector<ToolSchema> schemas() const override { return inner_.schemas(); }
  ToolObservation run(const ToolCall& call, double timeout_s, const std::atomic<bool>& stop) override {
    ToolObservation obs = inner_.run(call, timeout_s, stop);
    const nlohmann::json data = nlohmann::json::parse(obs.data.dump());
    std::string reason = sandbox_failure_reason(data.contains("sandbox") ? data["sandbox"] : data);
    if (!reason.empty()) count_sandbox_failure(reason);
    return obs;
  }

 private:
  ToolExecutor& inner_;
};

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using store::BuildStatus;
using store::OutcomeReason;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Outcome {
  BuildStatus status;
  OutcomeReason reason;
  std::string message;
};

// Budgets of this build: the worker's defaults, overridden by the build's own where set.
Limits build_limits(const Limits& defaults, const store::Limits& own) {
  Limits l = defaults;
  if (own.max_steps > 0) l.max_steps = static_cast<int>(own.max_steps);
  if (own.max_tokens > 0) l.max_generated_tokens = own.max_tokens;
  if (own.max_wall_s > 0) l.max_wall_s = static_cast<double>(own.max_wall_s);
  return l;
}

std::string cap(std::string text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t half = max_bytes / 2;
  return text.substr(0, half) + "\n[... " + std::to_string(text.size() - 2 * half) + " bytes cut ...]\n" +
         text.substr(text.size() - half);
}

// One attempt at one build. Owned by the worker thread that claimed it.
class BuildRun {
 public:
  BuildRun(store::Store& store, const store::Build& build, const WorkerOptions& options, const ModelProvider& models,
           StopSignal& stop)
      : store_(store), build_(build), options_(options), models_(models), stop_(stop),
        events_(store, build.id, build.attempt),
        workspace_(build_workspace(options.workspace_root, build.id)),
        branch_("kiln/" + std::to_string(build.id)), results_repo_(results_repository(options)),
        policy_(options.sandbox) {}

  BuildReport run() {
    LeaseKeeper lease(store_, build_.id, build_.attempt, options_.lease_ms, options_.heartbeat_interval, stop_);
    status("setup", {{"attempt", build_.attempt}, {"repo", build_.spec.repo}, {"ref", build_.spec.ref}});
    if (build_.attempt > 1) recover_lost_attempt_metrics();
    std::string resume_note;
    if (!options_.sandbox_unusable.empty()) {
      count_sandbox_failure("unusable");
      emit("error", {{"phase", "setup"}, {"message", "the sandbox is unusable on this host: " + options_.sandbox_unusable}});
      return finish({BuildStatus::error, OutcomeReason::infra_error,
                     "the sandbox is unusable on this host: " + options_.sandbox_unusable});
    }
    if (auto error = set_up_workspace(resume_note)) return finish({BuildStatus::error, OutcomeReason::infra_error, *error});
    if (verify_pending_) {
      // An earlier attempt's agent submitted and its change was committed; it died in verify.
      // The agent phase is over: only verify runs again, on the committed tree.
      metrics_.seconds_setup = seconds_since(started_);
      auto head = tools::git_head_commit(workspace_);
      if (!head.ok()) return finish({BuildStatus::error, OutcomeReason::infra_error, "resume before verify: " + head.error});
      if (auto diff = tools::git_diff(workspace_); diff.ok()) diff_ = bounded_diff(diff.value);
      if (auto error = publish()) return finish({BuildStatus::error, OutcomeReason::infra_error, *error});
      Outcome outcome = verify();
      if (stop_.cause() == StopCause::lease_lost || stop_.cause() == StopCause::shutdown)
        return abandoned("stopped during verify: " + std::string(stop_cause_name(stop_.cause())));
      BuildReport report = finish(outcome);
      report.commit = head.value;
      return report;
    }
    const Clock::time_point wait_start = Clock::now();
    auto model = models_(build_.spec.model, build_.id);  // may load it, or wait for a free session
    metrics_.seconds_model_wait = seconds_since(wait_start);
    if (!model) return finish({BuildStatus::error, OutcomeReason::model_error, "model `" + build_.spec.model + "`: " + model.error()});
    metrics_.seconds_setup = seconds_since(started_) - metrics_.seconds_model_wait;

    AgentResult agent = run_agent_phase(**model, resume_note);
    if (agent.reason == StopReason::lease_lost || agent.reason == StopReason::shutdown)
      return abandoned(std::string(stop_reason_name(agent.reason)) + ": " + agent.message);
    std::string commit;
    // Before verify: the commit is what the agent left. A change that cannot be committed (or
    // saved) is lost with the workspace, so the build cannot claim success.
    if (auto error = commit_changes(commit); error && agent.reason != StopReason::cancelled)
      return finish({BuildStatus::error, OutcomeReason::infra_error, *error});
    if (auto error = publish(); error && agent.reason != StopReason::cancelled)
      return finish({BuildStatus::error, OutcomeReason::infra_error, *error});
    if (agent.reason == StopReason::submitted && build_.spec.verify && !mark_verify_pending())
      return finish({BuildStatus::error, OutcomeReason::infra_error, "cannot write " + verify_marker().string()});
    Outcome outcome = decide(agent);
    if (stop_.cause() == StopCause::lease_lost || stop_.cause() == StopCause::shutdown)
      return abandoned("stopped during verify: " + std::string(stop_cause_name(stop_.cause())));
    BuildReport report = finish(outcome);
    report.commit = commit;
    return report;
  }

  BuildReport fail_internal(const std::string& what) {
    emit("error", {{"message", "internal error: " + what}});
    return finish({BuildStatus::error, OutcomeReason::infra_error, "internal error: " + what});
  }

 private:
  // An earlier attempt that died without writing its totals (a crash, a kill, a lost lease) still
  // left its per-step metric and tool_call events in the log: its model tokens, prefill and decode
  // times, steps, tool calls and wall time are summed from them and added to the build's metrics,
  // so a resumed build is compared across models with all it spent. An attempt that wrote its
  // totals has a metric event with seconds_wall, and is skipped.
  void recover_lost_attempt_metrics() {
    std::map<int, store::BuildMetrics> lost;
    std::map<int, bool> recorded;
    std::map<int, std::pair<int64_t, int64_t>> span_ms;  // first and last event time
    for (int64_t after = 0;;) {
      auto page = store_.read_events(build_.id, after, 1000);
      if (!page.ok() || page->empty()) break;
      for (const store::Event& e : *page) {
        after = e.seq;
        if (e.attempt <= 0 || e.attempt >= build_.attempt) continue;
        const Json p = Json::parse(e.payload_json, nullptr, false);
        if (!p.is_object()) continue;
        // An earlier resume already added that attempt's metrics (they are summed once).
        if (e.kind == "log" && p.contains("recovered_attempt") && p["recovered_attempt"].is_number_integer())
          recorded[p["recovered_attempt"].get<int>()] = true;
        // The store's transitions (claim, and the requeue written when recovery ran, maybe long
        // after the worker died) are not the attempt's work: its span is its worker's events.
        if (!(e.kind == "status" && !p.contains("phase"))) {
          auto& [first, last] = span_ms[e.attempt];
          if (first == 0) first = e.ts_ms;
          last = e.ts_ms;
        }
        store::BuildMetrics& m = lost[e.attempt];
        if (e.kind == "metric" && p.contains("seconds_wall")) recorded[e.attempt] = true;
        if (e.kind == "metric" && p.contains("step")) {
          ++m.steps;
          m.tokens_prefilled += p.value("tokens_prefilled", int64_t{0});
          m.tokens_cached += p.value("tokens_reused", int64_t{0});
          m.tokens_generated += p.value("tokens_generated", int64_t{0});
          m.tokens_reasoning += p.value("tokens_reasoning", int64_t{0});
          m.seconds_prefill += p.value("prefill_s", 0.0);
          m.seconds_decode += p.value("decode_s", 0.0);
          m.seconds_model_wait += p.value("wait_s", 0.0);
        } else if (e.kind == "tool_call" && p.contains("name") && p["name"].is_string()) {
          ++m.tool_calls[p["name"].get<std::string>()];
        }
      }
      if (page->size() < 1000) break;
    }
    for (auto& [attempt, m] : lost) {
      if (recorded[attempt]) continue;
      m.seconds_wall = std::max(0.0, double(span_ms[attempt].second - span_ms[attempt].first) / 1000.0 - m.seconds_model_wait);
      // The metrics and the event that marks them recovered go in one transaction: a kill in
      // between would otherwise have the next attempt add them again.
      const Json note = {{"phase", "resume"},
                         {"message", "metrics of attempt " + std::to_string(attempt) +
                                         " recovered from its log (it ended without writing them)"},
                         {"recovered_attempt", attempt}, {"steps", m.steps}, {"tokens_prefilled", m.tokens_prefilled},
                         {"tokens_generated", m.tokens_generated}};
      const store::NewEvent event{"log", note.dump(-1, ' ', false, Json::error_handler_t::replace)};
      if (auto added = store_.add_metrics(build_.id, build_.attempt, m, &event); !added.ok())
        std::cerr << "level=warn component=agent build=" << build_.id << " msg=\"recovered metrics not written\" error=\""
                  << added.error().message << "\"\n";
    }
  }

  // Fresh clone, or the previous attempt's workspace on resume. Returns an error message.
  std::optional<std::string> set_up_workspace(std::string& resume_note) {
    bool resumed = build_.attempt > 1 && try_resume(resume_note);
    if (!resumed) {
      std::error_code ec;
      tools::remove_tree(workspace_);
      fs::create_directories(options_.workspace_root, ec);
      auto clone = tools::git_clone_workspace(build_.spec.repo, build_.spec.ref, workspace_, std::to_string(build_.id));
      if (!clone.ok()) return "clone of " + build_.spec.repo + " failed: " + clone.error;
      base_commit_ = clone.value.base_commit;
      emit("log", {{"phase", "setup"}, {"message", "cloned"}, {"base_commit", base_commit_}, {"branch", clone.value.branch}});
    }
    policy_.workspace = workspace_;
    if (auto error = sandbox::prepare_workspace(policy_); !error.empty()) return "sandbox workspace: " + error;
    return std::nullopt;
  }

  // A re-claimed build: continue from the earlier attempt's workspace if it is still there.
  bool try_resume(std::string& note) {
    std::string previous = std::to_string(build_.attempt - 1);
    auto branch = fs::exists(workspace_ / ".git") ? tools::git_current_branch(workspace_) : tools::GitOutcome<std::string>{{}, "no workspace"};
    if (!branch.ok() || branch.value != branch_) {
      emit("log", {{"phase", "resume"}, {"from", "scratch"}, {"attempt", build_.attempt},
                   {"message", "attempt " + previous + " was interrupted and left no workspace; restarting from scratch"}});
      note = "attempt " + std::to_string(build_.attempt) + ": an earlier attempt was interrupted and its work is lost; "
             "you start from a fresh checkout";
      return false;
    }
    remove_stale_index_lock("resume");
    if (fs::exists(verify_marker())) {
      // The agent phase ended (submitted, committed) before the crash, so what is in the tree
      // beyond HEAD is verify's output: dropped, never committed.
      auto cleaned = tools::git_reset_clean(workspace_);
      if (!cleaned.ok()) {
        emit("log", {{"phase", "resume"}, {"from", "scratch"}, {"attempt", build_.attempt},
                     {"message", "attempt " + previous + " was interrupted during verify and its workspace cannot be "
                                 "reset (" + cleaned.error + "); restarting from scratch"}});
        note = "attempt " + std::to_string(build_.attempt) + ": an earlier attempt was interrupted and its work is lost; "
               "you start from a fresh checkout";
        return false;
      }
      verify_pending_ = true;
      emit("log", {{"phase", "resume"}, {"from", "verify"}, {"attempt", build_.attempt}, {"removed", cleaned.value},
                   {"message", "attempt " + previous + " was interrupted during verify; its committed change is verified "
                               "again (the agent phase is not repeated)"}});
      return true;
    }
    // Against the base, not HEAD: an attempt that got as far as committing left a clean tree.
    size_t changed = 0;
    if (auto diff = tools::git_diff(workspace_); diff.ok()) {
      for (size_t at = diff.value.rfind("diff --git ", 0) == 0 ? 0 : diff.value.find("\ndiff --git "); at != std::string::npos;
           at = diff.value.find("\ndiff --git ", at + 1))
        ++changed;
    }
    emit("log", {{"phase", "resume"}, {"from", "workspace"}, {"attempt", build_.attempt}, {"changed_files", changed},
                 {"message", "attempt " + previous + " was interrupted; restarting from its workspace"}});
    note = "attempt " + std::to_string(build_.attempt) + ": an earlier attempt was interrupted; the workspace keeps its "
           "changes (" + std::to_string(changed) + " files changed). Check them before going on";
    return true;
  }

  AgentResult run_agent_phase(ChatModel& model, const std::string& resume_note) {
    status("agent", {{"model", build_.spec.model}});
    tools::Context context;
    context.workspace = workspace_;
    context.policy = policy_;
    context.max_command_timeout = options_.max_command_timeout;
    context.build_id = std::to_string(build_.id);
    tools::ToolRegistry registry = tools::default_registry();
    RegistryToolExecutor registry_executor(registry, context);
    CountingToolExecutor executor(registry_executor);
    AgentTask task{build_.spec.task, build_.spec.repo + (build_.spec.ref.empty() ? "" : " at " + build_.spec.ref),
                   build_.spec.verify.value_or(""), resume_note};
    AgentResult result = run_agent(task, build_limits(options_.limits, build_.spec.limits), model, executor, events_, stop_);
    const Counters& c = result.counters;
    metrics_.tokens_prefilled = c.prefilled_tokens;
    metrics_.tokens_cached = c.reused_tokens;
    metrics_.tokens_generated = c.generated_tokens;
    metrics_.tokens_reasoning = c.reasoning_tokens;
    metrics_.steps = c.steps;
    for (const auto& [name, n] : c.tool_calls_by_name) metrics_.tool_calls[name] = n;
    metrics_.seconds_prefill = c.prefill_s;
    metrics_.seconds_decode = c.decode_s;
    metrics_.seconds_tools = c.tools_s;
    metrics_.seconds_model_wait += c.wait_s;  // not the build's own time: out of seconds_wall
    return result;
  }

  Outcome decide(const AgentResult& agent) {
    switch (agent.reason) {
      case StopReason::submitted: return verify();
      case StopReason::step_limit: return {BuildStatus::failed, OutcomeReason::step_limit, agent.message};
      case StopReason::token_limit: return {BuildStatus::failed, OutcomeReason::token_limit, agent.message};
      case StopReason::time_limit: return {BuildStatus::failed, OutcomeReason::time_limit, agent.message};
      case StopReason::cancelled: return {BuildStatus::cancelled, OutcomeReason::cancelled, agent.message};
      case StopReason::model_error: return {BuildStatus::error, OutcomeReason::model_error, agent.message};
      default: return {BuildStatus::error, OutcomeReason::infra_error, agent.message};
    }
  }

  Outcome verify() {
    const std::string command = build_.spec.verify.value_or("");
    if (command.empty()) return {BuildStatus::succeeded, OutcomeReason::no_verify, "submitted; no verify command"};
    status("verify", {{"command", command}});
    auto t0 = Clock::now();
    sandbox::Policy policy = policy_;
    policy.limits.wall_timeout = options_.verify_timeout;
    sandbox::RunOptions run_options;
    run_options.cancel = &stop_.flag();
    sandbox::Result r = sandbox::run({"bash", "-c", command}, policy, run_options);
    metrics_.seconds_verify = seconds_since(t0);
    if (std::string reason = sandbox_failure_reason(r.to_json()); !reason.empty()) count_sandbox_failure(reason);
    emit("log", {{"phase", "verify"}, {"command", command}, {"exit_code", r.exit_code}, {"timed_out", r.timed_out},
                 {"cancelled", r.cancelled}, {"seconds", metrics_.seconds_verify}, {"error", r.error},
                 {"output", cap(r.joined_output(), 16 * 1024)}});
    if (!r.ok()) return {BuildStatus::error, OutcomeReason::infra_error, "verify could not run: " + r.error};
    if (r.cancelled) return {BuildStatus::cancelled, OutcomeReason::cancelled, "cancelled during verify"};
    if (r.timed_out) return {BuildStatus::failed, OutcomeReason::verify_failed, "verify timed out: " + command};
    if (r.exit_code != 0)
      return {BuildStatus::failed, OutcomeReason::verify_failed, "verify failed with exit code " + std::to_string(r.exit_code)};
    return {BuildStatus::succeeded, OutcomeReason::verified, "verify passed: " + command};
  }

  std::string bounded_diff(std::string diff) const {
    if (diff.size() <= kMaxStoredDiffBytes) return diff;
    // The commit keeps the whole change; the stored copy (API, web page, every build list read)
    // stays bounded when a build generates megabytes of files.
    size_t cut = diff.rfind('\n', kMaxStoredDiffBytes);
    cut = cut == std::string::npos ? kMaxStoredDiffBytes : cut + 1;
    const size_t total = diff.size();
    diff.resize(cut);
    diff += "[kiln: diff cut at " + std::to_string(cut) + " of " + std::to_string(total) +
            " bytes; the whole change is on branch " + branch_ + " of " + results_repo_.string() + " (git fetch " +
            results_repo_.string() + " " + branch_ + ")]\n";
    return diff;
  }

  // kiln is the only writer of the workspace's .git (the sandbox mounts it read-only), so an
  // index.lock there was left by a kiln that died mid-write: it would fail every later commit.
  void remove_stale_index_lock(const char* phase) {
    std::error_code ec;
    if (fs::remove(workspace_ / ".git" / "index.lock", ec))
      emit("log", {{"phase", phase}, {"message", "removed a stale .git/index.lock left by an interrupted kiln"}});
  }

  // Commits the workspace on kiln/<id>; the diff against the base is stored with the outcome.
  // Sets `commit` (empty when nothing changed); returns the cause when the change could not be
  // committed.
  std::optional<std::string> commit_changes(std::string& commit) {
    status("commit", {{"branch", branch_}});
    auto diff = tools::git_diff(workspace_);
    if (!diff.ok()) {
      emit("error", {{"phase", "commit"}, {"message", "diff failed: " + diff.error}});
      return "commit failed: cannot diff the workspace: " + diff.error;
    }
    diff_ = bounded_diff(std::move(diff.value));
    if (diff_.empty()) {
      emit("log", {{"phase", "commit"}, {"message", "no changes to commit"}});
      return std::nullopt;
    }
    remove_stale_index_lock("commit");
    if (auto pending = tools::git_status(workspace_); pending.ok() && pending.value.empty()) {
      // Differs from the base, nothing to commit: an earlier attempt committed before it was cut off.
      auto head = tools::git_head_commit(workspace_);
      if (!head.ok()) {
        emit("error", {{"phase", "commit"}, {"message", "head commit: " + head.error}});
        return "commit failed: " + head.error;
      }
      emit("log", {{"phase", "commit"}, {"commit", head.value}, {"branch", branch_}, {"diff_bytes", diff_.size()},
                   {"message", "already committed by an earlier attempt"}});
      commit = head.value;
      return std::nullopt;
    }
    std::vector<std::string> nested;
    auto committed = tools::git_commit_all(workspace_, build_.spec.task, &nested);
    if (!nested.empty()) {
      emit("log", {{"phase", "commit"}, {"skipped", nested},
                   {"message", "not committed: directories holding their own git repository (a `git init` or a "
                               "fixture repository inside the tree)"}});
    }
    if (!committed.ok() && !nested.empty() && committed.error.find("nothing to commit") != std::string::npos) {
      // Only nested repositories changed: the branch stays where it was.
      auto head = tools::git_head_commit(workspace_);
      if (head.ok() && head.value != base_commit_) commit = head.value;
      return std::nullopt;
    }
    if (!committed.ok()) {
      emit("error", {{"phase", "commit"}, {"message", "commit failed: " + committed.error}});
      return "commit failed: " + committed.error;
    }
    emit("log", {{"phase", "commit"}, {"commit", committed.value}, {"branch", branch_}, {"diff_bytes", diff_.size()}});
    commit = committed.value;
    return std::nullopt;
  }

  // The workspace is removed when the build finishes: kiln/<id> is pushed into the results
  // repository under var, where it stays fetchable. Returns the cause when it could not be.
  std::optional<std::string> publish() {
    static std::mutex results_mu;  // one push at a time: the first one creates the repository
    std::lock_guard lock(results_mu);
    auto pushed = tools::git_push_branch(workspace_, branch_, results_repo_);
    if (!pushed.ok()) {
      keep_workspace_ = true;  // the only copy of the branch: marked so that no sweep removes it
      std::ofstream(keep_marker(workspace_)) << "the result branch could not be pushed: " << pushed.error << "\n";
      emit("error", {{"phase", "commit"}, {"message", "push to the results repository failed: " + pushed.error}});
      return "the result branch " + branch_ + " could not be saved: " + pushed.error;
    }
    published_ = pushed.value;
    return std::nullopt;
  }

  fs::path verify_marker() const { return workspace_ / ".git" / "kiln-verify-pending"; }
  // Written after the commit, before verify runs: a later attempt then knows that what the tree
  // holds beyond HEAD is verify's output (inside .git, which commands cannot write).
  bool mark_verify_pending() {
    std::ofstream out(verify_marker());
    out << "agent phase over; the change is committed; verify runs next\n";
    return static_cast<bool>(out.flush());
  }

  BuildReport finish(const Outcome& outcome) {
    if (!published_.empty()) {
      emit("log", {{"phase", "result"}, {"branch", branch_}, {"commit", published_},
                   {"results_repo", results_repo_.string()},
                   {"fetch", "git fetch " + results_repo_.string() + " " + branch_},
                   {"message", "the result branch is kept in the results repository"}});
    }
    metrics_.seconds_wall = seconds_since(started_) - metrics_.seconds_model_wait;
    emit("metric", Json::parse(store::to_json(metrics_)));
    if (auto added = store_.add_metrics(build_.id, build_.attempt, metrics_); !added.ok())
      std::cerr << "level=warn component=agent build=" << build_.id << " msg=\"metrics not written\" error=\""
                << added.error().message << "\"\n";
    store::FinishRequest request;
    request.status = outcome.status;
    request.reason = outcome.reason;
    request.result_branch = branch_;
    request.result_diff = diff_;
    if (outcome.status != BuildStatus::succeeded) request.error_message = outcome.message;
    auto finished = store_.finish(build_.id, build_.attempt, request);
    BuildReport report{finished.ok(), outcome.status, outcome.reason, outcome.message, "", ""};
    if (!finished.ok()) report.message = "finish not written: " + finished.error().message;
    if (!published_.empty()) report.results_repo = results_repo_.string();
    if (finished.ok() && !options_.keep_workspaces && !keep_workspace_) {
      std::string error;
      if (!tools::remove_tree(workspace_, &error))
        std::cerr << "level=warn component=agent build=" << build_.id << " msg=\"workspace not removed\" error=\""
                  << error << "\"\n";
    }
    return report;
  }

  // Lease lost or shutting down: no outcome; keep the workspace for a later attempt.
  // Stopped without an outcome (shutdown, lost lease): the build goes back to the queue. What this
  // attempt spent is added to the build's metrics while the lease still holds (after a lost lease
  // the store's fence refuses it), so a resumed build's totals include the interrupted attempt.
  // The totals event marks them as recorded (see recover_lost_attempt_metrics). On shutdown the
  // attempt is handed back at once (store release, fenced): the build is queued again now, not
  // when its lease expires, and a restart does not use up one of its attempts.
  BuildReport abandoned(std::string message) {
    metrics_.seconds_wall = seconds_since(started_) - metrics_.seconds_model_wait;
    emit("metric", Json::parse(store::to_json(metrics_)));
    (void)store_.add_metrics(build_.id, build_.attempt, metrics_);
    if (stop_.cause() == StopCause::shutdown) {
      if (auto released = store_.release(build_.id, build_.attempt); !released.ok())
        message += " (not handed back: " + released.error().message + "; its lease will expire)";
      else
        message += " (handed back to the queue)";
    }
    BuildReport report;
    report.message = std::move(message);
    return report;
  }

  void status(const char* phase, Json fields) {
    fields["phase"] = phase;
    emit("status", fields);
  }
  void emit(std::string_view kind, const Json& payload) {
    if (!events_.emit(kind, payload)) stop_.request(StopCause::lease_lost);
  }

  store::Store& store_;
  const store::Build& build_;
  const WorkerOptions& options_;
  const ModelProvider& models_;
  StopSignal& stop_;
  StoreEventSink events_;
  const fs::path workspace_;
  const std::string branch_;
  const fs::path results_repo_;
  sandbox::Policy policy_;
  const Clock::time_point started_ = Clock::now();
  std::string base_commit_;
  std::string diff_;
  std::string published_;        // the commit pushed to the results repository
  bool keep_workspace_ = false;  // it holds the only copy of the result
  bool verify_pending_ = false;  // resumed after the agent phase: only verify runs
  store::BuildMetrics metrics_;
};

}  // namespace

std::filesystem::path build_workspace(const std::filesystem::path& workspace_root, int64_t build_id) {
  return workspace_root / (kWorkspacePrefix + std::to_string(build_id));
}

int sweep_workspaces(store::Store& store, const std::filesystem::path& workspace_root) {
  int removed = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(workspace_root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t prefix = std::string_view(kWorkspacePrefix).size();
    if (name.rfind(kWorkspacePrefix, 0) != 0) continue;
    int64_t id = 0;
    try {
      size_t used = 0;
      id = std::stoll(name.substr(prefix), &used);
      if (used != name.size() - prefix) continue;
    } catch (const std::exception&) {
      continue;
    }
    if (fs::exists(keep_marker(it->path()), ec)) continue;  // the only copy of a result: kept
    auto build = store.get(id, /*include_diff=*/false);
    // Queued or running builds may resume from theirs; a store error says nothing: kept.
    bool unknown = !build.ok() && build.error().code == store::ErrorCode::not_found;
    if (!unknown && (!build.ok() || !store::is_terminal(build->status))) continue;
    std::string error;
    if (tools::remove_tree(it->path(), &error)) {
      ++removed;
    } else {
      std::cerr << "level=warn component=agent msg=\"workspace not removed\" path=\"" << it->path().string()
                << "\" error=\"" << error << "\"\n";
    }
  }
  return removed;
}

std::filesystem::path results_repository(const WorkerOptions& options) {
  if (!options.results_repo.empty()) return options.results_repo;
  return options.workspace_root.parent_path() / "results.git";
}

BuildReport run_build(store::Store& store, const store::Build& build, const WorkerOptions& options,
                      const ModelProvider& models, StopSignal& stop) {
  BuildRun run(store, build, options, models, stop);
  try {
    return run.run();
  } catch (const std::exception& e) {  // a programming error: record it on the build, keep the worker
    return run.fail_internal(e.what());
  }
}

}  // namespace kiln::agent
