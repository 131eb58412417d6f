// Hostile commands: each attack must fail, and kiln (this process) must keep working after it.
// Limits are small so each case takes at most a few seconds.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "sandbox/sandbox.h"
#include "sandbox/temp_workspace.h"

namespace kiln::sandbox {
namespace {

using kiln::testing::TempWorkspace;
using namespace std::chrono_literals;

Result sh(const Policy& p, const std::string& script) { return run({"bash", "-c", script}, p); }

bool host_path_exists(const char* path) {
  struct stat st {};
  return lstat(path, &st) == 0;
}

// Host processes whose command line contains `needle` (excluding this test process).
int host_processes_matching(const std::string& needle) {
  int count = 0;
  DIR* dir = opendir("/proc");
  while (dirent* e = dir ? readdir(dir) : nullptr) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    for (char& c : cmd) if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos && std::stoi(e->d_name) != getpid()) ++count;
  }
  if (dir) closedir(dir);
  return count;
}

// Live (not zombie) host processes owned by `uid`.
int host_processes_of(uid_t uid) {
  int count = 0;
  DIR* dir = opendir("/proc");
  while (dirent* e = dir ? readdir(dir) : nullptr) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    struct stat st {};
    if (stat((std::string("/proc/") + e->d_name).c_str(), &st) != 0 || st.st_uid != uid) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat_line;
    std::getline(in, stat_line);
    auto close = stat_line.rfind(')');
    if (close != std::string::npos && close + 2 < stat_line.size() && stat_line[close + 2] == 'Z') continue;
    ++count;
  }
  if (dir) closedir(dir);
  return count;
}

void expect_kiln_still_works(const Policy& p) {
  Result r = sh(p, "echo alive");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.output, "alive\n");
  EXPECT_EQ(r.exit_code, 0);
}

TEST(Hostile, NoNetworkButLoopback) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(8000);
  // 192.0.2.1 is TEST-NET-1: never routed, so even a broken sandbox would not reach anything.
  Result curl = sh(p, "curl -sS --max-time 2 http://192.0.2.1/ 2>&1; echo rc=$?");
  ASSERT_TRUE(curl.ok()) << curl.error;
  EXPECT_EQ(curl.output.find("rc=0"), std::string::npos) << curl.output;
  EXPECT_NE(curl.output.find("Couldn't connect"), std::string::npos) << curl.output;
  Result py = sh(p, "python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('192.0.2.1', 80))\" 2>&1");
  EXPECT_NE(py.exit_code, 0);
  EXPECT_NE(py.output.find("Network is unreachable"), std::string::npos) << py.output;
  Result ifaces = sh(p, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(ifaces.output, "lo\n");
  Result loop = sh(p, "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
                      "c=socket.create_connection(s.getsockname()); print('loopback ok')\"");
  EXPECT_EQ(loop.output, "loopback ok\n");
}

TEST(Hostile, SystemHomeAndGitAreNotWritable) {
  TempWorkspace ws;
  ws.write(".git/config", "[core]\n");
  Policy p = ws.prepared_policy();
  Result r = sh(p, "echo x > /etc/kiln-evil; echo x > /usr/kiln-evil; echo x > /root/kiln-evil; echo x > /kiln-evil; "
                   "echo x >> .git/config; ln -s /etc/passwd pw; echo x >> pw; "
                   "echo home > $HOME/ok && cat $HOME/ok");
  ASSERT_TRUE(r.ok()) << r.error;
  // EACCES or EROFS, whichever the kernel checks first: either way the write is refused.
  for (const char* target : {"/etc/kiln-evil", "/usr/kiln-evil", "/root/kiln-evil", "/kiln-evil", ".git/config", "pw"}) {
    std::string line = std::string(target) + ": ";
    bool refused = r.output.find(line + "Read-only file system") != std::string::npos ||
                   r.output.find(line + "Permission denied") != std::string::npos ||
                   r.output.find(line + "No such file or directory") != std::string::npos;
    EXPECT_TRUE(refused) << target << " in:\n" << r.output;
  }
  EXPECT_NE(r.output.find("home\n"), std::string::npos) << r.output;  // $HOME is inside the workspace
  for (const char* path : {"/etc/kiln-evil", "/usr/kiln-evil", "/root/kiln-evil", "/kiln-evil"}) {
    EXPECT_FALSE(host_path_exists(path)) << path;
  }
  EXPECT_EQ(ws.read(".git/config"), "[core]\n");
  EXPECT_EQ(ws.read(".kiln/home/ok"), "home\n");
}

TEST(Hostile, ForkBombIsContainedByTheProcessLimitAndTheNextCommandRuns) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(2500);
  p.uid = p.gid = 65533;  // its own uid, so parallel tests (uid 65534) keep their process budget
  p.limits.max_processes = 40;
  std::atomic<bool> done{false};
  int peak = 0;
  std::thread watcher([&] {
    while (!done) {
      peak = std::max(peak, host_processes_of(65533));
      std::this_thread::sleep_for(20ms);
    }
  });
  Result r = sh(p, "bomb() { bomb | bomb & }; bomb; sleep 5");
  done = true;
  watcher.join();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.timed_out || r.exit_code != 0);
  if (geteuid() == 0) {
    EXPECT_GT(peak, 5) << "the bomb never ran as uid 65533";
    EXPECT_LE(peak, 40 + 2) << "RLIMIT_NPROC did not hold the bomb";
    EXPECT_EQ(host_processes_of(65533), 0) << "processes of the bomb survived the call";
  }
  expect_kiln_still_works(ws.prepared_policy());
}

TEST(Hostile, AllocatingEightGibFails) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy();
  p.limits.memory_bytes = 512ull << 20;
  Result r = sh(p, "python3 -c \"b = bytearray(8 << 30); b[-1] = 1; print('allocated')\" 2>&1");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output.find("allocated"), std::string::npos) << r.output;
  expect_kiln_still_works(ws.prepared_policy());
}

TEST(Hostile, YesForeverIsTruncatedAndKilledAtTheTimeout) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(1500);
  p.limits.output_head_bytes = 4096;
  p.limits.output_tail_bytes = 4096;
  auto start = std::chrono::steady_clock::now();
  Result r = sh(p, "exec -a kiln-yes-marker yes");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(r.output.size(), 8192u);
  EXPECT_GT(r.dropped_bytes, 1'000'000u);
  EXPECT_EQ(r.output.substr(0, 4), "y\ny\n");
  EXPECT_EQ(host_processes_matching("kiln-yes-marker"), 0);
}

TEST(Hostile, DisownedBackgroundProcessDoesNotSurviveTheCall) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(5000);
  auto start = std::chrono::steady_clock::now();
  Result r = sh(p, "sleep 987.654 & disown; nohup sleep 987.655 >/dev/null 2>&1 & setsid sleep 987.656 & echo started");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.output, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(host_processes_matching("sleep 987.65"), 0);
}

TEST(Hostile, SigtermIgnoringCommandIsKilledAfterTheGrace) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(800);
  p.limits.kill_grace = 300ms;
  auto start = std::chrono::steady_clock::now();
  Result r = sh(p, "trap '' TERM; echo ready; while true; do sleep 0.05; done");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.output, "ready\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Hostile, SigtermComesFirstSoACommandCanCleanUp) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy(800);
  p.limits.kill_grace = 1500ms;
  Result r = sh(p, "trap 'echo cleaning up; exit 3' TERM; sleep 30 & wait");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.output, "cleaning up\n");
}

TEST(Hostile, FileSizeLimitStopsHugeWrites) {
  TempWorkspace ws;
  Policy p = ws.prepared_policy();
  p.limits.max_file_bytes = 1 << 20;
  Result r = sh(p, "head -c 4M /dev/zero > big; echo rc=$?");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.output.find("rc=0"), std::string::npos) << r.output;
  struct stat st {};
  ASSERT_EQ(stat((ws.path() / "big").c_str(), &st), 0);
  EXPECT_LE(st.st_size, 1 << 20);
}

}  // namespace
}  // namespace kiln::sandbox
