// A scratch workspace under /tmp for sandbox tests, removed on destruction.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "sandbox/sandbox.h"

namespace kiln::testing {

class TempWorkspace {
 public:
  TempWorkspace() {
    char tmpl[] = "/tmp/kiln-test-XXXXXX";
    path_ = mkdtemp(tmpl);
    chmod(path_.c_str(), 0755);  // the sandbox uid must be able to enter it
  }
  ~TempWorkspace() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempWorkspace(const TempWorkspace&) = delete;
  TempWorkspace& operator=(const TempWorkspace&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& relative, const std::string& bytes) const {
    std::filesystem::create_directories((path_ / relative).parent_path());
    std::ofstream(path_ / relative, std::ios::binary) << bytes;
  }
  std::string read(const std::string& relative) const {
    std::ifstream in(path_ / relative, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // A policy with short limits for tests, workspace prepared for the sandbox uid.
  sandbox::Policy policy(int timeout_ms = 5000) const {
    sandbox::Policy p;
    p.workspace = path_;
    p.limits.wall_timeout = std::chrono::milliseconds(timeout_ms);
    p.limits.kill_grace = std::chrono::milliseconds(300);
    p.limits.memory_bytes = 1ull << 30;
    p.limits.max_processes = 64;
    p.limits.tmp_bytes = 16u << 20;
    return p;
  }
  sandbox::Policy prepared_policy(int timeout_ms = 5000) const {
    sandbox::Policy p = policy(timeout_ms);
    std::string e = sandbox::prepare_workspace(p);
    if (!e.empty()) throw std::runtime_error(e);
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln::testing
