// kiln::sandbox — run one command isolated under bubblewrap. The only header other folders include.
//
// Contract (see sandbox/README.md for the hostile cases it holds against):
// - run() starts `bwrap` as a child process (no shell in between), with the workspace as the only
//   writable tree (bound at /workspace), the system read-only, no network but loopback, a private
//   size-limited /tmp, the repository's .git read-only, a clean environment, resource limits set
//   before exec, and — when kiln runs as root — the whole sandboxed tree under an unprivileged host
//   uid (Policy::uid), so RLIMIT_NPROC applies (the kernel exempts host root from it).
// - A host-side watchdog enforces the wall clock: SIGTERM to every process of the command, then
//   SIGKILL after Limits::kill_grace; nothing started by the command outlives run().
// - Failures of the sandbox itself (bwrap missing, fork failed, bad workspace) come back in
//   Result::error with a message naming the cause; the command never runs unsandboxed unless the
//   policy says Mode::none explicitly (development only, flagged in every result).
// Thread-safety: run() and probe() are reentrant; each call owns its child process and pipes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::sandbox {

// Where the workspace appears inside the sandbox (and the command's working directory).
inline constexpr const char* kWorkspaceMount = "/workspace";

struct Limits {
  std::chrono::milliseconds wall_timeout{120'000};
  std::chrono::milliseconds kill_grace{1'000};  // between SIGTERM and SIGKILL
  std::uint64_t cpu_seconds = 600;                        // RLIMIT_CPU, per process
  std::uint64_t memory_bytes = 4ull << 30;                // RLIMIT_AS per process; cgroup memory limit when available
  std::uint64_t max_processes = 256;                      // RLIMIT_NPROC of the host uid; cgroup pids.max when available
  std::uint64_t max_file_bytes = 1ull << 30;              // RLIMIT_FSIZE
  std::uint64_t max_open_files = 1024;                    // RLIMIT_NOFILE
  std::uint64_t tmp_bytes = 512ull << 20;                 // size of the private /tmp tmpfs
  std::size_t output_head_bytes = 256 << 10;              // captured output keeps this much of the start
  std::size_t output_tail_bytes = 256 << 10;              // ... and this much of the end; the middle is counted
};

enum class Mode {
  bwrap,  // the real sandbox; the only mode builds use
  none,   // development only: runs the command directly with rlimits and the watchdog, NO isolation
};

struct Policy {
  std::filesystem::path workspace;  // host directory bound read-write at /workspace; must exist
  Mode mode = Mode::bwrap;
  Limits limits;
  // Host uid/gid of the sandboxed tree when kiln runs as root. When kiln is not root the command
  // runs as kiln's own uid (it cannot be switched), which the probe reports. Builds that run at
  // the same time share RLIMIT_NPROC if they share a uid; give workers distinct uids to separate.
  uid_t uid = 65534;
  gid_t gid = 65534;
  bool use_cgroups = true;  // put each command in its own memory/pids cgroup where one is writable
  std::vector<std::pair<std::string, std::string>> extra_env;  // added after the clean defaults
  std::filesystem::path bwrap_path;  // empty: found on PATH
};

struct Result {
  std::string error;        // non-empty: the sandbox failed and the command did not (fully) run
  bool unsandboxed = false; // Mode::none was used — never in a build
  int exit_code = -1;       // exit status of the command (bwrap reports 128+N for a signal N inside)
  int signal = 0;           // set when the sandbox process itself was killed by a signal
  bool timed_out = false;   // the wall clock ran out and the watchdog killed the command
  bool cancelled = false;   // the cancellation flag stopped it
  std::string output;       // stdout+stderr interleaved as produced: head, then tail when bytes were dropped
  std::size_t head_bytes = 0;       // output[0, head_bytes) is the head; the rest is the tail
  std::uint64_t total_output_bytes = 0;
  std::uint64_t dropped_bytes = 0;  // bytes produced between head and tail, not kept
  double wall_seconds = 0;
  // user+system of bwrap and what it reaped; the command's own CPU time is often missing because
  // bwrap's pid-namespace init is not waited for by the outer bwrap. Not a limit: RLIMIT_CPU is.
  double cpu_seconds = 0;
  std::uint64_t peak_rss_bytes = 0; // cgroup peak when in force, else the largest process's max RSS
  std::vector<std::string> enforced;  // which layers were in force ("bwrap", "uid 65534", "cgroup memory", ...)

  bool ok() const { return error.empty(); }
  // The JSON form's "output" is valid UTF-8 (invalid bytes replaced), so it can always be dumped.
  // Head + "[... N bytes dropped ...]" + tail (the marker only when something was dropped).
  std::string joined_output() const;
  nlohmann::json to_json() const;
};

struct RunOptions {
  // Checked about every 20 ms; when it becomes true the command is killed (SIGKILL, no grace) and
  // run() returns within ~100 ms with cancelled = true.
  const std::atomic<bool>* cancel = nullptr;
  // Called on the calling thread with each chunk of output as it arrives (all of it, uncapped).
  std::function<void(std::string_view)> on_output;
};

// Replaces invalid UTF-8 with U+FFFD (command output is bytes; JSON and prompts need UTF-8).
std::string valid_utf8(const std::string& text);

// Runs argv[0] (looked up on the sandbox's PATH) with its arguments. Blocks until the command and
// everything it started are gone. Never throws for outside-world failures.
Result run(const std::vector<std::string>& argv, const Policy& policy, const RunOptions& options = {});

// The bwrap argument vector for a policy, without the bwrap program itself: a pure function of the
// policy, the host's top-level layout (which of /bin, /lib, ... are symlinks) and argv.
struct HostLayout {
  std::vector<std::pair<std::string, std::string>> symlinks;  // path -> target, e.g. "/bin" -> "usr/bin"
  std::vector<std::string> directories;                       // existing dirs to bind read-only
  bool has_git_dir = false;                                   // workspace/.git exists (bound read-only)
  uid_t run_uid = 0;  // host uid the sandboxed tree runs as (policy.uid under root, else kiln's)
  gid_t run_gid = 0;
  static HostLayout detect(const Policy& policy);
};
std::vector<std::string> bwrap_args(const Policy& policy, const HostLayout& layout,
                                    const std::vector<std::string>& argv);
// The environment the command sees (name, value), in order.
std::vector<std::pair<std::string, std::string>> sandbox_env(const Policy& policy);

// Makes `policy.workspace` usable by the sandboxed uid: creates .kiln/home and, when kiln runs as
// root, gives the tree (except .git, which stays kiln's and is mounted read-only) to policy.uid.
// Returns an error message naming the path at fault, or "" on success.
std::string prepare_workspace(const Policy& policy);

// Which isolation layers work on this host, checked by really starting sandboxes.
struct ProbeLayer {
  std::string name;    // "bwrap", "user namespace", "unprivileged uid", "network isolation", ...
  bool ok = false;
  std::string detail;  // what was found, or why it does not work
};
struct ProbeReport {
  bool usable = false;    // builds may run: bwrap starts and isolates; otherwise builds fail infra_error
  std::string reason;     // when !usable: why, in one line
  std::vector<ProbeLayer> layers;
  nlohmann::json to_json() const;
  std::string to_text() const;
};
ProbeReport probe(const Policy& policy);

}  // namespace kiln::sandbox
