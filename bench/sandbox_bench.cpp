// How much does the sandbox cost? Runs `true` N times directly (fork + exec + wait) and through
// sandbox::run() in each mode, and prints runs per second and the overhead against direct exec.
//
//   sandbox_bench [--iterations N]
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/sandbox.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  std::string name;
  int runs = 0;
  int failures = 0;
  double total_s = 0;
  std::vector<double> ms;
};

Stats measure(const std::string& name, int n, const std::function<bool()>& once) {
  Stats s;
  s.name = name;
  once();  // warm up (page cache, cgroup detection)
  auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    if (!once()) ++s.failures;
    s.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  s.total_s = std::chrono::duration<double>(Clock::now() - start).count();
  s.runs = n;
  std::sort(s.ms.begin(), s.ms.end());
  return s;
}

bool direct_true() {
  pid_t pid = fork();
  if (pid == 0) {
    char* argv[] = {const_cast<char*>("true"), nullptr};
    char* envp[] = {nullptr};
    execve("/usr/bin/true", argv, envp);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 100;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      n = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--iterations N]\n", argv[0]);
      return 2;
    }
  }
  char tmpl[] = "/tmp/kiln-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  chmod(tmpl, 0755);
  kiln::sandbox::Policy policy;
  policy.workspace = tmpl;
  if (std::string e = kiln::sandbox::prepare_workspace(policy); !e.empty()) {
    std::fprintf(stderr, "workspace: %s\n", e.c_str());
    return 1;
  }
  auto sandboxed = [&](kiln::sandbox::Policy p) {
    return [p] {
      kiln::sandbox::Result r = kiln::sandbox::run({"true"}, p);
      return r.ok() && r.exit_code == 0;
    };
  };
  kiln::sandbox::Policy none = policy;
  none.mode = kiln::sandbox::Mode::none;
  kiln::sandbox::Policy no_cgroup = policy;
  no_cgroup.use_cgroups = false;

  std::vector<Stats> rows;
  rows.push_back(measure("direct fork+exec", n, direct_true));
  rows.push_back(measure("run(), Mode::none (rlimits, watchdog)", n, sandboxed(none)));
  rows.push_back(measure("run(), bwrap, no cgroup", n, sandboxed(no_cgroup)));
  kiln::sandbox::Result probe_run = kiln::sandbox::run({"true"}, policy);
  std::string layers;
  for (const auto& e : probe_run.enforced) layers += (layers.empty() ? "" : ", ") + e;
  rows.push_back(measure("run(), bwrap, full policy", n, sandboxed(policy)));
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);

  utsname u{};
  uname(&u);
  std::printf("command: ");
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\nmachine: %s %s, %u CPUs, euid %d; full policy enforced: %s\n\n", u.sysname, u.release,
              std::thread::hardware_concurrency(), static_cast<int>(geteuid()), layers.c_str());
  std::printf("| %-38s | %5s | %4s | %9s | %8s | %8s | %8s | %13s |\n", "mode (`true`)", "runs", "fail", "runs/s",
              "mean ms", "p50 ms", "p95 ms", "overhead ms");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(40, '-').c_str(), std::string(7, '-').c_str(),
              std::string(6, '-').c_str(), std::string(11, '-').c_str(), std::string(10, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str(), std::string(15, '-').c_str());
  double direct_mean = rows[0].total_s * 1000 / rows[0].runs;
  for (const auto& s : rows) {
    double mean = s.total_s * 1000 / s.runs;
    std::printf("| %-38s | %5d | %4d | %9.1f | %8.2f | %8.2f | %8.2f | %+13.2f |\n", s.name.c_str(), s.runs, s.failures,
                s.runs / s.total_s, mean, s.ms[s.ms.size() / 2], s.ms[s.ms.size() * 95 / 100], mean - direct_mean);
  }
  return 0;
}
