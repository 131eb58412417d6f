// The host-side watchdog: the parent's loop while a command runs.
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "sandbox/output_capture.h"
#include "sandbox/process_tree.h"
#include "sandbox/runner_internal.h"

namespace kiln::sandbox {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void Watch::loop(Result& result) {
  // States: running → (deadline) terminating → (grace over) killing; running → (cancel) killing.
  enum class Phase { running, terminating, killing } phase = Phase::running;
  OutputCapture capture(policy.limits.output_head_bytes, policy.limits.output_tail_bytes);
  const auto deadline = start + policy.limits.wall_timeout;
  Clock::time_point phase_since = start;
  bool eof = false, exited = false;
  int status = 0;
  rusage usage{};
  std::string buffer(64 * 1024, '\0');
  // A pidfd wakes the poll below the moment the child exits (Linux 5.3+); without one, the loop
  // notices the exit at its next 5–20 ms tick.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));

  // SIGKILL to every process of the command. The outer bwrap is spared at first so that it reaps
  // its pid-namespace init (whose death takes the whole namespace down) and exits normally —
  // killing it first would leave that init as an orphan zombie on hosts whose pid 1 does not reap.
  // If bwrap itself is still there after 500 ms, it is killed too.
  const bool direct = policy.mode == Mode::none;
  Clock::time_point first_kill{};
  auto kill_everything = [&] {
    auto now = Clock::now();
    if (first_kill == Clock::time_point{}) first_kill = now;
    bool include_root = direct || now - first_kill >= milliseconds(500);
    signal_tree(pid, SIGKILL, include_root);
    cgroup.signal_all(SIGKILL);
  };

  while (!(eof && exited)) {
    if (!exited) {
      pid_t w = wait4(pid, &status, WNOHANG, &usage);
      if (w == pid) {
        exited = true;
        // bwrap's exit took its pid namespace with it. Without bwrap (Mode::none) the process
        // group may still hold the output pipe, and the cgroup may hold stragglers: end them.
        if (direct) kill(-pid, SIGKILL);
        cgroup.signal_all(SIGKILL);
        phase_since = Clock::now();
      }
    }
    const auto now = Clock::now();
    if (exited && !eof && now - phase_since > milliseconds(500)) break;  // a stray writer: stop reading
    if (!exited) {
      bool cancel = options.cancel != nullptr && options.cancel->load();
      if (cancel && phase != Phase::killing) {
        result.cancelled = true;
        kill_everything();
        phase = Phase::killing;
        phase_since = now;
      } else if (phase == Phase::running && now >= deadline) {
        result.timed_out = true;
        // The command gets a chance to clean up; the outer bwrap is spared so the tree stays whole.
        // Exactly one SIGTERM per process: a shell runs its TERM trap once per signal received.
        std::vector<pid_t> tree = descendants(pid);
        for (pid_t p : cgroup.members()) tree.push_back(p);
        std::sort(tree.begin(), tree.end());
        tree.erase(std::unique(tree.begin(), tree.end()), tree.end());
        for (pid_t p : tree) {
          if (p != pid) kill(p, SIGTERM);
        }
        phase = Phase::terminating;
        phase_since = now;
      } else if (phase == Phase::terminating && now - phase_since >= policy.limits.kill_grace) {
        kill_everything();
        phase = Phase::killing;
        phase_since = now;
      } else if (phase == Phase::killing && now - phase_since >= milliseconds(100)) {
        kill_everything();  // repeat: processes forked between the scan and the kill; escalate
        phase_since = now;
      }
    }
    if (eof && exited) break;
    pollfd fds[2] = {{eof ? -1 : out_fd, POLLIN, 0}, {exited ? -1 : pidfd, POLLIN, 0}};
    if (eof && pidfd < 0) {
      usleep(5'000);  // only waiting for the exit now
      continue;
    }
    int ready = poll(fds, 2, 20);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(out_fd, buffer.data(), buffer.size());
      if (n > 0) {
        std::string_view chunk(buffer.data(), static_cast<std::size_t>(n));
        capture.append(chunk);
        if (options.on_output) options.on_output(chunk);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        eof = true;
      }
    }
  }
  if (pidfd >= 0) close(pidfd);
  if (!exited) {  // defensive: the loop only leaves early after exit, but never leak a zombie
    kill(-pid, SIGKILL);
    signal_tree(pid, SIGKILL, true);
    wait4(pid, &status, 0, &usage);
  }

  result.output = capture.head();
  result.head_bytes = result.output.size();
  result.output += capture.tail();
  result.total_output_bytes = capture.total_bytes();
  result.dropped_bytes = capture.dropped_bytes();
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
    result.exit_code = 128 + result.signal;
  }
  auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  result.cpu_seconds = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  result.peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace kiln::sandbox
