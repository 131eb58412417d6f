// Test helpers: a temp directory, a real kiln server on an ephemeral loopback port over a real
// SQLite file, and small wrappers over kiln's own HTTP client.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "server/client.h"
#include "server/config.h"
#include "server/server.h"
#include "store/store.h"

namespace kiln::server::testing {

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("kiln-server-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline ServerConfig test_config(const TempDir& dir) {
  ServerConfig c;
  c.listen.host = "127.0.0.1";
  c.listen.port = 0;
  c.db_path = (dir.path() / "kiln.db").string();
  c.var_dir = dir.path().string();
  c.io_threads = 2;
  c.start_workers = false;  // the tests play the worker through the store
  ModelConfig m;
  m.name = "test-model";
  m.path = (dir.path() / "no-such-model").string();
  c.models.push_back(m);
  ModelConfig m2 = m;
  m2.name = "other-model";
  c.models.push_back(m2);
  return c;
}

// A git repository with one commit (README, calc.sh) at `dir`, made with the git CLI (test setup).
inline void make_git_repo(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::string d = dir.string();
  std::string cmd = "cd '" + d + "' && git init -q -b main . && printf 'kiln test repository\\n' > README && "
                    "printf 'echo $((1 - 1))\\n' > calc.sh && git add . && "
                    "git -c user.name=kiln -c user.email=kiln@example.invalid commit -qm init";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A git repository for submissions that only need to pass the submit-time source check (made
// once per test process, removed at exit).
inline const std::string& any_repo() {
  static const TempDir dir;
  static const std::string path = [] {
    make_git_repo(dir.path() / "repo");
    return (dir.path() / "repo").string();
  }();
  return path;
}

// The turns of a scripted test model (ServerConfig's "scripted_test_turns"): `bash_turns` turns
// that each think for a while (decode_ms per scripted token) and run one bash command, then
// one that fixes calc.sh, then `submit`. `extra_command` (if any) runs as the last bash call.
inline std::string scripted_turns_json(int bash_turns, int decode_ms, const std::string& extra_command = {}) {
  nlohmann::json turns = nlohmann::json::array();
  for (int i = 1; i <= bash_turns; ++i) {
    turns.push_back({{"reasoning", "Step " + std::to_string(i) + ": look at the workspace before changing it."},
                     {"decode_ms_per_token", decode_ms},
                     {"calls", {{{"name", "bash"}, {"arguments", {{"command", "echo step-" + std::to_string(i) +
                                                                                 " >> .kiln/steps && wc -l < .kiln/steps"}}}}}}});
  }
  turns.push_back({{"text", "The sign in calc.sh is wrong."},
                   {"calls", {{{"name", "str_replace"},
                               {"arguments", {{"path", "calc.sh"}, {"old_str", "1 - 1"}, {"new_str", "1 + 1"}}}}}}});
  if (!extra_command.empty()) {
    turns.push_back({{"calls", {{{"name", "bash"}, {"arguments", {{"command", extra_command}}}}}}});
  }
  turns.push_back({{"calls", {{{"name", "submit"}, {"arguments", {{"summary", "calc.sh adds now"}}}}}}});
  return turns.dump();
}

// A server whose real worker pool runs builds on the scripted test model "scripted-test".
inline ServerConfig live_config(const TempDir& dir, const std::string& turns_json) {
  ServerConfig c = test_config(dir);
  c.start_workers = true;
  c.workers = 1;
  c.lease_seconds = 2;
  c.models.clear();
  ModelConfig m;
  m.name = "scripted-test";
  m.scripted_test_turns = turns_json;
  c.models.push_back(m);
  return c;
}

// A running server for one test.
class ServerFixture {
 public:
  explicit ServerFixture(ServerConfig config) {
    std::string error;
    server_ = Server::start(config, log_, error);
    if (!server_) throw std::runtime_error("server did not start: " + error);
    ServerUrl url;
    url.host = "127.0.0.1";
    url.port = std::to_string(server_->port());
    client_ = std::make_unique<Client>(url, config.token, 10);
  }
  Server& server() { return *server_; }
  store::Store& store() { return server_->store(); }
  Client& client() { return *client_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  // One request; fails the test on a transport error.
  ClientResponse call(const std::string& method, const std::string& target, const std::string& body = {}) {
    ClientResponse res;
    auto err = client_->request(method, target, body, res);
    EXPECT_FALSE(err.has_value()) << *err;
    return res;
  }
  nlohmann::json json_of(const ClientResponse& r) { return nlohmann::json::parse(r.body, nullptr, false); }
  // Follows build `id`'s event stream to its `end` event and returns that event (an empty
  // object, and a test failure, when the stream breaks first).
  nlohmann::json wait_for_end(int64_t id) {
    nlohmann::json end = nlohmann::json::object();
    auto err = client_->stream("/v1/builds/" + std::to_string(id) + "/events", 0, [&](const SseMessage& m) {
      if (m.event != "end") return StreamControl::keep_going;
      end = nlohmann::json::parse(m.data);
      return StreamControl::stop;
    });
    EXPECT_FALSE(err.has_value()) << *err;
    return end;
  }

 private:
  std::ostringstream log_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

// Moves a queued build to running through the store (what a worker does) and returns its attempt.
inline int claim_build(store::Store& s, int64_t id) {
  store::ClaimRequest req;
  req.owner = "test-worker";
  req.lease_ms = 60'000;
  for (;;) {
    auto claimed = s.claim(req);
    if (!claimed.ok() || !claimed.value().has_value()) return -1;
    if (claimed.value()->id == id) return claimed.value()->attempt;
  }
}

inline store::BuildSpec spec_for(const std::string& task, const std::string& model = "test-model") {
  store::BuildSpec spec;
  spec.repo = "/tmp/repo";
  spec.task = task;
  spec.model = model;
  return spec;
}

}  // namespace kiln::server::testing
