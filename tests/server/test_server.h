// Test helpers: a temp directory, a real kiln server on an ephemeral loopback port over a real
// SQLite file, and small wrappers over kiln's own HTTP client.
#pragma once

#include <gtest/gtest.h>

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
