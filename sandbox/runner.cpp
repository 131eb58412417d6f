// run(): fork, set limits, drop to the sandbox uid, exec bwrap; then read output and watch the
// clock on the calling thread until the command and everything it started are gone.
//
// Kill sequence (watchdog): at the deadline, SIGTERM to every process of the command except the
// outer bwrap (so the command can clean up); after kill_grace, SIGKILL to the outer bwrap's
// process group, every descendant and every member of the command's cgroups. bwrap's
// --die-with-parent then takes the pid namespace down, so nothing survives. Cancellation skips
// the grace period.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "sandbox/cgroup.h"
#include "sandbox/output_capture.h"
#include "sandbox/process_tree.h"
#include "sandbox/runner_internal.h"
#include "sandbox/sandbox.h"

namespace kiln::sandbox {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// What the child reports through the exec-status pipe when it fails before exec.
struct ChildFailure {
  int stage;
  int error;
};
constexpr const char* kStageNames[] = {"join cgroup", "set resource limits", "drop to sandbox uid",
                                       "enter workspace", "exec"};

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

// Everything the child needs, prepared before fork(): after fork in a threaded process only
// async-signal-safe calls are allowed, so no allocation happens in the child.
struct ExecPlan {
  std::string program;
  std::vector<std::string> args;  // args[0] is the program name
  std::vector<std::string> env;   // "NAME=value"
  std::vector<std::pair<int, rlimit>> rlimits;
  std::vector<std::string> cgroup_procs;
  bool drop_privileges = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string chdir_to;  // Mode::none only
};

[[noreturn]] void child_fail(int fd, int stage) {
  ChildFailure failure{stage, errno};
  ssize_t ignored = write(fd, &failure, sizeof failure);
  (void)ignored;
  _exit(127);
}

[[noreturn]] void child_main(const ExecPlan& plan, char* const* argv, char* const* envp, int devnull,
                             int out_fd, int status_fd, pid_t parent) {
  setsid();  // own process group: the watchdog signals the group
  dup2(devnull, 0);
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  for (const auto& file : plan.cgroup_procs) {  // join before dropping privileges: files are root's
    int fd = open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) child_fail(status_fd, 0);
    close(fd);
  }
  for (const auto& [resource, limit] : plan.rlimits) {
    if (setrlimit(resource, &limit) != 0) child_fail(status_fd, 1);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // kiln gone → bwrap gone → (die-with-parent) sandbox gone
  if (getppid() != parent) _exit(127);
  if (plan.drop_privileges) {
    if (setgroups(0, nullptr) != 0 || setgid(plan.gid) != 0 || setuid(plan.uid) != 0) child_fail(status_fd, 2);
    if (setuid(0) == 0) { errno = EPERM; child_fail(status_fd, 2); }  // must be irreversible
  }
  if (!plan.chdir_to.empty() && chdir(plan.chdir_to.c_str()) != 0) child_fail(status_fd, 3);
  umask(022);
  syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);  // no inherited kiln fds
  execve(plan.program.c_str(), argv, envp);
  child_fail(status_fd, 4);
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::vector<std::pair<int, rlimit>> rlimits_for(const Limits& l) {
  auto both = [](std::uint64_t v) { return rlimit{static_cast<rlim_t>(v), static_cast<rlim_t>(v)}; };
  // RLIMIT_CPU: soft limit sends SIGXCPU, the hard one a second later SIGKILL.
  return {{RLIMIT_CPU, rlimit{static_cast<rlim_t>(l.cpu_seconds), static_cast<rlim_t>(l.cpu_seconds + 1)}},
          {RLIMIT_AS, both(l.memory_bytes)},
          {RLIMIT_NPROC, both(l.max_processes)},
          {RLIMIT_FSIZE, both(l.max_file_bytes)},
          {RLIMIT_NOFILE, both(l.max_open_files)},
          {RLIMIT_CORE, both(0)}};
}

// bwrap with a pid namespace is two processes: the outer one (our child) and the namespace's
// init. The outer one exits as soon as init reports the command's status, before init itself is
// reaped, so init is orphaned; where kiln is the orphans' reaper (pid 1 of a container, or a
// subreaper) nothing else collects it, and the zombies pile up against the sandbox uid's
// RLIMIT_NPROC until no command can start. Each run ends by reaping such zombies: children named
// bwrap that no run is waiting for (every run's own outer bwrap is in this registry from fork()
// until its wait4, so one run never steals another's exit status).
std::mutex g_outer_mu;
std::set<pid_t> g_outer_pids;  // GUARDED_BY(g_outer_mu)

void reap_orphaned_sandbox_inits() {
  std::lock_guard lock(g_outer_mu);
  for (pid_t pid : zombie_children_named("bwrap"))
    if (!g_outer_pids.count(pid)) waitpid(pid, nullptr, WNOHANG);
}

// bwrap reports its own setup failures (before the command starts) as "bwrap: <what>" and exit
// status 1: that is the sandbox failing, not the command. "" when the result is the command's,
// including "bwrap: execvp <cmd>: ..." (the command does not exist: the caller's mistake).
std::string bwrap_setup_failure(const Result& r) {
  if (r.timed_out || r.cancelled || r.exit_code != 1 || r.output.rfind("bwrap: ", 0) != 0) return "";
  if (r.output.rfind("bwrap: execvp ", 0) == 0) return "";
  const std::string line = r.output.substr(0, r.output.find('\n'));
  return "sandbox could not start: " + line;
}

}  // namespace

Result run(const std::vector<std::string>& argv, const Policy& policy, const RunOptions& options) {
  Result result;
  const auto start = Clock::now();
  if (std::string e = check_request(argv, policy); !e.empty()) {
    result.error = e;
    return result;
  }
  ExecPlan plan;
  plan.rlimits = rlimits_for(policy.limits);
  plan.drop_privileges = geteuid() == 0;
  plan.uid = policy.uid;
  plan.gid = policy.gid;
  if (plan.drop_privileges) result.enforced.push_back("uid " + std::to_string(policy.uid));
  result.enforced.push_back("rlimits");

  CommandCgroup cgroup;
  if (policy.mode == Mode::bwrap) {
    std::string bwrap = find_bwrap(policy);
    if (bwrap.empty()) {
      result.error = "bwrap not found (looked on PATH; install the Debian package 'bubblewrap')";
      return result;
    }
    if (std::string e = ensure_home(policy); !e.empty()) {
      result.error = e;
      return result;
    }
    plan.program = bwrap;
    plan.args = bwrap_args(policy, HostLayout::detect(policy), argv);
    plan.args.insert(plan.args.begin(), "bwrap");
    plan.env = {"PATH=/usr/bin:/bin"};  // bwrap's own; the command's is set by --clearenv/--setenv
    result.enforced.insert(result.enforced.begin(), "bwrap");
    if (policy.use_cgroups && (CgroupSupport::get().memory() || CgroupSupport::get().pids())) {
      if (std::string e = cgroup.create(policy.limits.memory_bytes, policy.limits.max_processes); e.empty()) {
        plan.cgroup_procs = cgroup.procs_files();
        for (auto& layer : cgroup.enforced()) result.enforced.push_back(layer);
      } else {
        result.enforced.push_back("no cgroup: " + e);
      }
    }
  } else {
    result.unsandboxed = true;
    result.enforced.insert(result.enforced.begin(), "NO SANDBOX (--sandbox=none)");
    plan.program = resolve_on_path(argv[0]);
    if (plan.program.empty()) {
      result.error = "command not found: " + argv[0];
      return result;
    }
    plan.args = argv;
    for (auto& [name, value] : sandbox_env(policy)) {
      std::string v = value;
      if (v.rfind(kWorkspaceMount, 0) == 0) v = policy.workspace.string() + v.substr(std::strlen(kWorkspaceMount));
      plan.env.push_back(name + "=" + v);
    }
    plan.chdir_to = policy.workspace.string();
  }

  int out_pipe[2], status_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(status_pipe, O_CLOEXEC) != 0) {
    result.error = std::string("cannot create pipes: ") + std::strerror(errno);
    return result;
  }
  Fd out_r(out_pipe[0]), out_w(out_pipe[1]), status_r(status_pipe[0]), status_w(status_pipe[1]);
  Fd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<char*> c_argv = c_strings(plan.args);
  std::vector<char*> c_env = c_strings(plan.env);
  pid_t parent = getpid();
  pid_t pid;
  {
    std::lock_guard lock(g_outer_mu);  // registered before it can exit (see reap_orphaned_sandbox_inits)
    pid = fork();
    if (pid == 0) child_main(plan, c_argv.data(), c_env.data(), devnull.fd, out_w.fd, status_w.fd, parent);
    if (pid > 0) g_outer_pids.insert(pid);
  }
  if (pid < 0) {
    result.error = std::string("fork failed: ") + std::strerror(errno);
    return result;
  }
  struct Unregister {
    pid_t pid;
    ~Unregister() {
      {
        std::lock_guard lock(g_outer_mu);
        g_outer_pids.erase(pid);
      }
      reap_orphaned_sandbox_inits();
    }
  } unregister{pid};

  out_w.reset();
  status_w.reset();
  ChildFailure failure{};
  ssize_t n;
  do n = read(status_r.fd, &failure, sizeof failure); while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failure)) {
    waitpid(pid, nullptr, 0);
    result.error = std::string("sandbox could not start: ") + kStageNames[failure.stage] + " failed: " +
                   std::strerror(failure.error);
    if (failure.stage == 4 && failure.error == EAGAIN) {
      result.error += " (RLIMIT_NPROC: uid " + std::to_string(policy.uid) + " already runs too many processes)";
    }
    return result;
  }

  Watch watch{pid, out_r.fd, start, policy, options, cgroup};
  watch.loop(result);
  if (policy.mode == Mode::bwrap) result.error = bwrap_setup_failure(result);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (std::uint64_t peak = cgroup.peak_memory_bytes(); peak > 0) result.peak_rss_bytes = peak;
  return result;
}

}  // namespace kiln::sandbox
