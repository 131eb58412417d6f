// kill -9 of the real `kiln serve` process in the middle of a build, then a restart on the same
// database: the build is recovered (its lease expires, recovery requeues it, a worker resumes it
// from its workspace) and finishes; its event seqs are gapless; nothing a client was told
// (a 201 for a submit, an event it streamed) is lost. The model is the scripted test model of the
// serve config, so the build's length and outcome are the script's.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string kiln_binary() {
  const char* env = std::getenv("KILN_BIN");
  return env != nullptr ? env : KILN_BINARY_DIR "/bin/kiln";
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `kiln serve --config <file>` as a child process on an ephemeral port; its log goes to a file.
class ServeProcess {
 public:
  ServeProcess(const std::filesystem::path& config, const std::filesystem::path& log) : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::string bin = kiln_binary();
      ::execl(bin.c_str(), bin.c_str(), "serve", "--config", config.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  // The port from the "listening" log line, or 0 when the process did not get there in time.
  uint16_t wait_for_port() {
    for (int i = 0; i < 300; ++i) {
      std::string text = read_text(log_);
      size_t at = text.find("msg=\"kiln serve listening\" url=http://127.0.0.1:");
      if (at != std::string::npos) {
        size_t start = text.find("127.0.0.1:", at) + 10;
        return static_cast<uint16_t>(std::stoi(text.substr(start, text.find(' ', start) - start)));
      }
      if (exited()) return 0;
      std::this_thread::sleep_for(20ms);
    }
    return 0;
  }
  void kill(int signo) { ::kill(pid_, signo); }
  // Waits for the process; returns its wait status.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }
  std::string log() const { return read_text(log_); }

 private:
  bool exited() {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return true;
    }
    return false;
  }
  std::filesystem::path log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

Client client_for(uint16_t port) {
  ServerUrl url;
  url.port = std::to_string(port);
  return Client(url, "", 10);
}

// Streams a build's events from the start to `end`; returns the end status ("" on failure).
std::string follow_to_end(const Client& client, int64_t id, std::vector<SseMessage>& events) {
  std::string status;
  auto err = client.stream("/v1/builds/" + std::to_string(id) + "/events", 0, [&](const SseMessage& m) {
    if (m.event == "end") {
      status = json::parse(m.data)["status"];
      return StreamControl::stop;
    }
    events.push_back(m);
    return StreamControl::keep_going;
  });
  EXPECT_FALSE(err.has_value()) << *err;
  return status;
}

TEST(Crash, KillNineMidBuildThenRestartRecoversAndFinishesTheBuild) {
  std::string bin = kiln_binary();
  ASSERT_TRUE(std::filesystem::exists(bin)) << bin << " is missing: build the `kiln` target first";
  testing::TempDir dir;
  testing::make_git_repo(dir.path() / "repo");
  json config = {{"listen", "127.0.0.1:0"},
                 {"db", (dir.path() / "kiln.db").string()},
                 {"var_dir", (dir.path() / "var").string()},
                 {"workers", 1},
                 {"lease_seconds", 2},
                 {"models", {{{"name", "scripted-test"},
                              {"scripted_test_turns", json::parse(testing::scripted_turns_json(6, 25))}}}}};
  std::ofstream(dir.path() / "kiln.json") << config.dump(2);

  ServeProcess first(dir.path() / "kiln.json", dir.path() / "serve1.log");
  uint16_t port = first.wait_for_port();
  ASSERT_NE(port, 0) << first.log();
  Client c1 = client_for(port);
  std::vector<int64_t> ids;
  for (const char* task : {"make calc.sh add", "make calc.sh add, again"}) {
    ClientResponse r;
    json body = {{"repo", (dir.path() / "repo").string()}, {"task", task}};
    ASSERT_FALSE(c1.request("POST", "/v1/builds", body.dump(), r).has_value());
    ASSERT_EQ(r.status, 201) << r.body;  // acknowledged: it must survive the crash
    ids.push_back(json::parse(r.body)["id"].get<int64_t>());
  }

  // Follow the first build; after its second tool result (mid-build), kill -9 the server.
  std::vector<SseMessage> seen;
  int results = 0;
  auto err = c1.stream("/v1/builds/" + std::to_string(ids[0]) + "/events", 0, [&](const SseMessage& m) {
    EXPECT_NE(m.event, "end") << "the build ended before the kill";
    seen.push_back(m);
    if (m.event == "tool_result" && ++results == 2) {
      first.kill(SIGKILL);
      return StreamControl::stop;
    }
    return StreamControl::keep_going;
  });
  ASSERT_FALSE(err.has_value()) << *err;
  int status = first.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ(results, 2);

  // Restart on the same database and config.
  ServeProcess second(dir.path() / "kiln.json", dir.path() / "serve2.log");
  port = second.wait_for_port();
  ASSERT_NE(port, 0) << second.log();
  Client c2 = client_for(port);
  std::vector<SseMessage> after;
  EXPECT_EQ(follow_to_end(c2, ids[0], after), "succeeded") << second.log();

  // Gapless 1..N, and every event streamed before the kill is there unchanged.
  ASSERT_GT(after.size(), seen.size());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_TRUE(after[i].id.has_value());
    EXPECT_EQ(*after[i].id, static_cast<int64_t>(i + 1));
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(after[i].id, seen[i].id);
    EXPECT_EQ(after[i].data, seen[i].data) << "event " << i + 1 << " changed across the crash";
  }
  // The second attempt resumed from the first one's workspace: its steps file kept counting
  // (a fresh clone would start again at 1).
  bool resumed = false;
  int first_attempt_steps = 0, second_attempt_first_count = 0;
  for (const SseMessage& m : after) {
    json e = json::parse(m.data);
    if (m.event == "log" && e["attempt"] == 2 && e["payload"].value("phase", "") == "resume") {
      resumed = e["payload"].value("from", "") == "workspace";
    }
    if (m.event != "tool_result" || e["payload"].value("name", "") != "bash") continue;
    std::string output = e["payload"].value("output", "");
    if (e["attempt"] == 1) ++first_attempt_steps;
    if (e["attempt"] == 2 && second_attempt_first_count == 0 && output.rfind("[exit code 0]\n", 0) == 0) {
      second_attempt_first_count = std::stoi(output.substr(14));
    }
  }
  EXPECT_TRUE(resumed) << "no resume-from-workspace log event in attempt 2";
  EXPECT_EQ(first_attempt_steps, 2);
  EXPECT_GE(second_attempt_first_count, first_attempt_steps + 1);

  ClientResponse r;
  ASSERT_FALSE(c2.request("GET", "/v1/builds/" + std::to_string(ids[0]), "", r).has_value());
  json build = json::parse(r.body);
  EXPECT_EQ(build["attempt"], 2);
  EXPECT_EQ(build["reason"], "no_verify");
  ASSERT_FALSE(c2.request("GET", "/v1/builds/" + std::to_string(ids[0]) + "/diff", "", r).has_value());
  EXPECT_NE(r.body.find("+echo $((1 + 1))"), std::string::npos) << r.body;

  // The second build, queued at the crash, is still there and runs too.
  std::vector<SseMessage> second_build;
  EXPECT_EQ(follow_to_end(c2, ids[1], second_build), "succeeded");
  EXPECT_NE(second.log().find("msg=\"recovered builds whose lease expired\" requeued=1"), std::string::npos)
      << second.log();

  second.kill(SIGTERM);
  status = second.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << second.log();
}

}  // namespace
}  // namespace kiln::server
