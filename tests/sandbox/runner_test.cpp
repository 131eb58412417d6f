// run(): results, environment, limits and errors, with the real bwrap.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "sandbox/process_tree.h"
#include "sandbox/sandbox.h"
#include "sandbox/temp_workspace.h"

namespace kiln::sandbox {
namespace {

using kiln::testing::TempWorkspace;
using namespace std::chrono_literals;

Result sh(const Policy& p, const std::string& script, const RunOptions& o = {}) { return run({"bash", "-c", script}, p, o); }

TEST(Runner, ReportsExitCodeAndInterleavedOutput) {
  TempWorkspace ws;
  Result r = sh(ws.prepared_policy(), "echo out1; echo err1 >&2; echo out2; exit 7");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.output, "out1\nerr1\nout2\n");
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.dropped_bytes, 0u);
  EXPECT_GT(r.wall_seconds, 0.0);
}

TEST(Runner, WorkspaceIsTheWorkingDirectoryAndWritable) {
  TempWorkspace ws;
  ws.write("input.txt", "from host\n");
  Result r = sh(ws.prepared_policy(), "pwd; cat input.txt; echo made > out.txt");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.output, "/workspace\nfrom host\n");
  EXPECT_EQ(ws.read("out.txt"), "made\n");
}

TEST(Runner, EnvironmentIsCleanAndKilnVariablesDoNotLeak) {
  TempWorkspace ws;
  setenv("KILN_SECRET_TOKEN", "hunter2", 1);
  Result r = sh(ws.prepared_policy(), "env | sort");
  unsetenv("KILN_SECRET_TOKEN");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.output.find("hunter2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("HOME=/workspace/.kiln/home\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CI=1\n"), std::string::npos);
  EXPECT_NE(r.output.find("PAGER=cat\n"), std::string::npos);
  EXPECT_NE(r.output.find("TERM=dumb\n"), std::string::npos);
}

TEST(Runner, CommandsNeverRunAsHostRoot) {
  TempWorkspace ws;
  Result r = sh(ws.prepared_policy(), "touch owned-by-me; id -u");
  ASSERT_TRUE(r.ok()) << r.error;
  struct stat st {};
  ASSERT_EQ(stat((ws.path() / "owned-by-me").c_str(), &st), 0);
  EXPECT_NE(st.st_uid, 0u) << "the sandboxed process created a file as host root";
  if (geteuid() == 0) {
    EXPECT_EQ(st.st_uid, 65534u);
  }
  EXPECT_NE(r.output, "0\n");
}

TEST(Runner, WallClockTimeoutKillsAndKeepsPartialOutput) {
  TempWorkspace ws;
  auto start = std::chrono::steady_clock::now();
  Result r = sh(ws.prepared_policy(700), "echo started; sleep 30; echo never");
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.output, "started\n");
  EXPECT_LT(took, 5s);
}

TEST(Runner, CancellationStopsACommandWithinAboutAHundredMilliseconds) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(20'000);
  std::atomic<bool> cancel{false};
  RunOptions o;
  o.cancel = &cancel;
  std::chrono::steady_clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(600ms);
    cancelled_at = std::chrono::steady_clock::now();
    cancel = true;
  });
  Result r = sh(p, "echo go; sleep 30", o);
  auto returned = std::chrono::steady_clock::now();
  canceller.join();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.cancelled);
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(returned - cancelled_at, 250ms);  // ~100 ms target; slack for a loaded 2-core CI box
}

TEST(Runner, OutputIsCappedHeadAndTailWithDroppedCount) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy();
  p.limits.output_head_bytes = 100;
  p.limits.output_tail_bytes = 50;
  Result r = sh(p, "printf 'S%.0s' $(seq 1000); seq 1 20000; printf 'END'");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.head_bytes, 100u);
  EXPECT_EQ(r.output.substr(0, 100), std::string(100, 'S'));
  EXPECT_EQ(r.output.substr(r.output.size() - 3), "END");
  EXPECT_EQ(r.output.size(), 150u);
  EXPECT_EQ(r.total_output_bytes, 1000u + 108894u + 3u);  // seq 1..20000 prints 108894 bytes
  EXPECT_EQ(r.dropped_bytes, r.total_output_bytes - 150);
  EXPECT_NE(r.joined_output().find("bytes of output dropped"), std::string::npos);
}

TEST(Runner, StreamsOutputToTheCallback) {
  TempWorkspace ws;
  std::string streamed;
  RunOptions o;
  o.on_output = [&](std::string_view chunk) { streamed += chunk; };
  Result r = sh(ws.prepared_policy(), "for i in 1 2 3; do echo line$i; done", o);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(streamed, "line1\nline2\nline3\n");
}

TEST(Runner, BadRequestsReturnErrorsNamingTheField) {
  TempWorkspace ws;
  Policy p = ws.policy();
  EXPECT_NE(run({}, p).error.find("command"), std::string::npos);
  Policy missing = p;
  missing.workspace = ws.path() / "does-not-exist";
  EXPECT_NE(run({"true"}, missing).error.find("does-not-exist"), std::string::npos);
  Policy zero = p;
  zero.limits.wall_timeout = 0ms;
  EXPECT_NE(run({"true"}, zero).error.find("wall_timeout"), std::string::npos);
  Policy no_bwrap = p;
  no_bwrap.bwrap_path = "/nonexistent/bwrap";
  Result r = run({"true"}, no_bwrap);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("bwrap not found"), std::string::npos) << r.error;
}

TEST(Runner, UnknownCommandIsAnExitCodeNotACrash) {
  TempWorkspace ws;
  Result r = run({"no-such-command-kiln"}, ws.prepared_policy());
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no-such-command-kiln"), std::string::npos) << r.output;
}

// bwrap's own failures (here a stand-in bwrap failing the way the real one does when it cannot
// set up the namespace) are the sandbox failing, not the command: an error, never an exit code the
// model or the verify step would take for the command's.
TEST(Runner, BwrapSetupFailureIsAnErrorNotTheCommandsExitCode) {
  TempWorkspace ws, bin;
  bin.write("bwrap", "#!/bin/sh\necho 'bwrap: Can'\\''t fork for pid 1: Resource temporarily unavailable' >&2\nexit 1\n");
  ASSERT_EQ(chmod((bin.path() / "bwrap").c_str(), 0755), 0);
  Policy p = ws.prepared_policy();
  p.bwrap_path = bin.path() / "bwrap";
  Result r = sh(p, "exit 0");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, "sandbox could not start: bwrap: Can't fork for pid 1: Resource temporarily unavailable");
  // The command's own "exit 1" with output of its own stays the command's.
  Result own = sh(ws.prepared_policy(), "echo 'bwrap is not here'; exit 1");
  EXPECT_TRUE(own.ok()) << own.error;
  EXPECT_EQ(own.exit_code, 1);
}

// The namespace's init, orphaned when the outer bwrap exits first, comes to kiln where kiln is the
// reaper (pid 1 of a container; a subreaper here): runs reap it, so zombies cannot pile up against
// the sandbox uid's process limit.
TEST(Runner, OrphanedSandboxInitsAreReaped) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  TempWorkspace ws;
  const Policy p = ws.prepared_policy();
  for (int i = 0; i < 8; ++i) ASSERT_EQ(sh(p, "true").exit_code, 0);
  std::this_thread::sleep_for(300ms);  // the last init exits after its outer bwrap
  ASSERT_EQ(sh(p, "true").exit_code, 0);
  EXPECT_LE(zombie_children_named("bwrap").size(), 1u);  // at most the last run's, still exiting
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(Runner, ModeNoneRunsUnsandboxedAndSaysSo) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy();
  p.mode = Mode::none;
  Result r = sh(p, "echo $HOME");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.unsandboxed);
  EXPECT_EQ(r.output, (ws.path() / ".kiln/home").string() + "\n");
}

TEST(Probe, ReportsTheLayersThatHoldHere) {
  ProbeReport report = probe(Policy{});
  ASSERT_TRUE(report.usable) << report.to_text();
  auto layer = [&](const std::string& name) {
    for (const auto& l : report.layers) if (l.name == name) return l;
    return ProbeLayer{name, false, "missing"};
  };
  EXPECT_TRUE(layer("network isolation").ok);
  EXPECT_TRUE(layer("unprivileged uid").ok) << layer("unprivileged uid").detail;
  EXPECT_TRUE(layer("read-only system").ok);
  EXPECT_EQ(report.to_json()["usable"], true);
}

}  // namespace
}  // namespace kiln::sandbox

namespace kiln::sandbox {
namespace {

TEST(Limits, EveryRlimitIsInForceInsideTheSandbox) {
  kiln::testing::TempWorkspace ws;
  Policy p = ws.prepared_policy();
  p.limits.cpu_seconds = 77;
  p.limits.memory_bytes = 900ull << 20;
  p.limits.max_processes = 55;
  p.limits.max_file_bytes = 12345678;
  p.limits.max_open_files = 99;
  Result r = run({"cat", "/proc/self/limits"}, p);
  ASSERT_TRUE(r.ok()) << r.error;
  auto has = [&](const std::string& row, const std::string& value) {
    auto at = r.output.find(row);
    if (at == std::string::npos) return false;
    std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    return line.find(" " + value + " ") != std::string::npos;
  };
  EXPECT_TRUE(has("Max cpu time", "77")) << r.output;
  EXPECT_TRUE(has("Max address space", std::to_string(900ull << 20))) << r.output;
  EXPECT_TRUE(has("Max processes", "55")) << r.output;
  EXPECT_TRUE(has("Max file size", "12345678")) << r.output;
  EXPECT_TRUE(has("Max open files", "99")) << r.output;
  EXPECT_TRUE(has("Max core file size", "0")) << r.output;
}

TEST(Limits, CpuSecondsStopABusyLoopBeforeTheWallClock) {
  kiln::testing::TempWorkspace ws;
  Policy p = ws.prepared_policy(20'000);
  p.limits.cpu_seconds = 1;
  Result r = run({"bash", "-c", "while :; do :; done"}, p);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(r.exit_code == 128 + SIGXCPU || r.exit_code == 128 + SIGKILL) << r.exit_code;
}

}  // namespace
}  // namespace kiln::sandbox
