// The build pipeline: one claimed build carried to a finished, recorded outcome.
//
//   setup   clone repo@ref into a fresh workspace (or keep the previous attempt's, see resume),
//           branch kiln/<id>, prepare the sandbox, open the model
//   agent   run_agent (loop.h) with the real tools and the store's event log
//   verify  the task's verify command in the sandbox, when the model submitted and one is given
//   commit  every change committed on kiln/<id> with the task as message; the diff is stored
//   finish  status + outcome reason + metrics written to the store (fenced by the attempt)
//
// Every phase emits a `status` event; wall time is split into setup, prefill, decode, tools,
// verify (queue is the store's). Resume: a build claimed again after an interrupted attempt
// says so in a `log` event, and continues from the workspace the earlier attempt left when it is
// still there (the model is told), otherwise starts from scratch and says that instead.
// A lost lease writes nothing more: the store (fencing, recovery) owns the build. A shutdown
// hands the attempt back (Store::release): queued again at once, not counted as a failed attempt.
// After the commit, kiln/<id> is pushed into the results repository (results_repository()), the
// only copy once the workspace is removed; a build that was interrupted during verify re-runs
// only verify on the committed tree (verify's leftovers are removed first).
// Threading: run_build runs on the calling worker thread; it starts one heartbeat thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/budgets.h"
#include "agent/chat_model.h"
#include "agent/result.h"
#include "agent/stop_signal.h"
#include "sandbox/sandbox.h"
#include "store/store.h"

namespace kiln::agent {

// Maps a build's model name to a fresh ChatModel for that build (one engine session per build).
// An error (unknown model, no free session, load failure) ends the build with model_error.
using ModelProvider =
    std::function<Result<std::unique_ptr<ChatModel>>(const std::string& model, int64_t build_id)>;

struct WorkerOptions {
  std::filesystem::path workspace_root = "var/workspaces";  // one directory per build under it
  // Bare repository every build's kiln/<id> is pushed into (created on first use), so the result
  // outlives the workspace; empty = results.git next to workspace_root (<var_dir>/results.git).
  std::filesystem::path results_repo;
  bool keep_workspaces = false;          // keep finished workspaces (debugging)
  int64_t lease_ms = 30'000;
  std::chrono::milliseconds heartbeat_interval{2'000};
  std::string owner = "kiln";            // lease owner; the pool appends "/worker-<n>"
  Limits limits;                         // defaults; a build's own limits (when > 0) override
  sandbox::Policy sandbox;               // template for tools and verify; workspace set per build
  std::chrono::milliseconds max_command_timeout{600'000};
  std::chrono::milliseconds verify_timeout{600'000};
  std::vector<std::string> models;       // claim only builds for these models; empty = any
  // Set when the sandbox probe at worker start found it unusable: every build then ends with
  // infra_error carrying this reason instead of running commands (WorkerPool sets it).
  std::string sandbox_unusable;
};

struct BuildReport {
  bool finished = false;  // the outcome was written (false: lease lost, shutdown, store failure)
  store::BuildStatus status = store::BuildStatus::error;
  store::OutcomeReason reason = store::OutcomeReason::infra_error;
  std::string message;
  std::string commit;  // the commit on kiln/<id>, when there were changes
  std::string results_repo;  // where kiln/<id> was pushed (`git fetch <results_repo> kiln/<id>`)
};

// Where build `build_id` works: build-<id> under workspace_root.
std::filesystem::path build_workspace(const std::filesystem::path& workspace_root, int64_t build_id);

// Removes the workspaces (build-<id> under workspace_root) of builds that ended (recovery gave
// them up or cancelled them, a cancel while queued after an interrupted attempt, a crash between
// finish and cleanup) or that the store does not know. Returns how many it removed.
int sweep_workspaces(store::Store& store, const std::filesystem::path& workspace_root);

// The bare repository the result branches go to (WorkerOptions::results_repo or its default).
std::filesystem::path results_repository(const WorkerOptions& options);

// Process-wide counts of sandbox failures in builds (tool commands and verify), by reason, for
// /metrics. Reasons (sandbox_failure_reason):
//   start_failed     the sandbox could not start the command (bwrap, fork, workspace, cgroup)
//   wall_timeout     the watchdog killed the command at its wall-clock limit
//   cpu_limit        RLIMIT_CPU (SIGXCPU inside the sandbox)
//   file_size_limit  RLIMIT_FSIZE (SIGXFSZ)
//   killed           SIGKILL inside the sandbox: the memory cgroup's OOM kill (or the command's own kill -9)
//   unusable         a build refused because the sandbox probe failed at worker start
// A command's own non-zero exit is not a sandbox failure; neither is a cancellation.
std::map<std::string, int64_t> sandbox_failure_counts();
void count_sandbox_failure(const std::string& reason);
// The failure reason of a sandbox::Result in its JSON form, or "" when it is not one.
std::string sandbox_failure_reason(const nlohmann::json& result);

BuildReport run_build(store::Store& store, const store::Build& build, const WorkerOptions& options,
                      const ModelProvider& models, StopSignal& stop);

}  // namespace kiln::agent
