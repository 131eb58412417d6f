// Crash safety: a child process appends events and is killed with SIGKILL mid-stream. Every
// event it was told was committed must be there after reopening, seqs gapless, and recovery
// must re-queue its build (LevelDB's "nothing acknowledged is lost").
//
// The child is this same test binary, re-executed with KILN_STORE_CRASH_CHILD set; the static
// initializer below runs the child's loop before GoogleTest's main and never returns.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "store_test_util.h"

extern char** environ;

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

constexpr const char* kChildEnv = "KILN_STORE_CRASH_CHILD";  // "db_path|build_id|attempt|fd"

// The child: append events forever, reporting each acknowledged seq on the pipe.
[[noreturn]] void crash_child_main(const std::string& arg) {
  std::istringstream in(arg);
  std::string path, id_text, attempt_text, fd_text;
  std::getline(in, path, '|');
  std::getline(in, id_text, '|');
  std::getline(in, attempt_text, '|');
  std::getline(in, fd_text, '|');
  int64_t id = std::stoll(id_text);
  int attempt = std::stoi(attempt_text);
  int fd = std::stoi(fd_text);
  StoreOptions options;
  options.path = path;
  options.recover_on_open = false;
  Result<std::unique_ptr<Store>> store = Store::open(options);
  if (!store) _exit(3);
  for (int64_t i = 0;; ++i) {
    std::string payload = R"({"line":)" + std::to_string(i) + R"(,"pad":")" + std::string(200, 'x') + "\"}";
    Result<int64_t> seq = (*store)->append_event(id, attempt, event_kind::log, payload);
    if (!seq) _exit(4);
    int64_t acked = *seq;
    if (write(fd, &acked, sizeof acked) != sizeof acked) _exit(5);
  }
}

const bool g_is_child = [] {
  if (const char* arg = std::getenv(kChildEnv)) crash_child_main(arg);
  return false;
}();

// Spawns the child, waits for `acks_before_kill` acknowledgements, SIGKILLs it and returns the
// highest seq it acknowledged (including acks still in the pipe when it died).
int64_t run_and_kill_child(const std::string& path, int64_t id, int attempt, int acks_before_kill) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  std::string var = std::string(kChildEnv) + "=" + path + "|" + std::to_string(id) + "|" +
                    std::to_string(attempt) + "|" + std::to_string(fds[1]);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(var.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  close(fds[1]);

  int64_t last = 0;
  int acks = 0;
  auto read_ack = [&]() -> bool {
    int64_t seq = 0;
    size_t got = 0;
    while (got < sizeof seq) {
      ssize_t n = read(fds[0], reinterpret_cast<char*>(&seq) + got, sizeof seq - got);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    EXPECT_GT(seq, last);
    last = seq;
    return true;
  };
  while (acks < acks_before_kill && read_ack()) ++acks;
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "child ended on its own (status " << status << ") after " << acks << " acks";
  while (read_ack()) {
  }
  close(fds[0]);
  return last;
}

TEST(StoreCrash, EventsAcknowledgedBeforeSigkillSurviveAndTheBuildIsRequeued) {
  TempDir dir;
  std::string path = dir.file("kiln.db");
  int64_t id = 0;
  int attempt = 0;
  {
    auto store = open_store(path);
    id = store->submit(spec())->id;
    Build b = **store->claim(claimer("child", 30'000));
    attempt = b.attempt;
  }
  int64_t acked = 0;
  // Several rounds: each kills a fresh child at a different point of its stream.
  for (int acks : {150, 37, 400}) {
    acked = std::max(acked, run_and_kill_child(path, id, attempt, acks));
  }

  ManualClock later;
  later.ms->store(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count() +
                  60'000);
  StoreOptions options;
  options.path = path;
  options.now_ms = later.fn();
  options.recover_on_open = false;
  auto store = std::move(*Store::open(options));
  std::vector<Event> events;
  for (int64_t after = 0;;) {
    Result<std::vector<Event>> page = store->read_events(id, after, 1000);
    ASSERT_OK(page);
    if (page->empty()) break;
    events.insert(events.end(), page->begin(), page->end());
    after = page->back().seq;
  }
  ASSERT_GE(static_cast<int64_t>(events.size()), acked);
  for (size_t i = 0; i < events.size(); ++i) ASSERT_EQ(events[i].seq, static_cast<int64_t>(i + 1));
  EXPECT_GE(events.back().seq, acked);  // an append in flight at the kill may also have landed

  Result<RecoveryReport> r = store->recover();
  ASSERT_OK(r);
  EXPECT_EQ(r->requeued, 1);
  Build b = *store->get(id);
  EXPECT_EQ(b.status, BuildStatus::queued);
  Result<std::vector<Event>> tail = store->read_events(id, events.back().seq);
  ASSERT_OK(tail);
  ASSERT_EQ(tail->size(), 1u);  // the requeue's status event, right after the last one
  EXPECT_NE((*tail)[0].payload_json.find("\"queued\""), std::string::npos);
  Build again = **store->claim(claimer("next"));
  EXPECT_EQ(again.attempt, attempt + 1);
}

}  // namespace
}  // namespace kiln::store
