// Helpers shared by the agent tests: temp directories, a store in one, example repositories.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "store/store.h"

namespace kiln::agent::testing {

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A store file in `dir` whose clock the test moves (ms since the epoch).
struct TestStore {
  std::shared_ptr<std::atomic<int64_t>> clock = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  std::unique_ptr<store::Store> store;
  explicit TestStore(const std::filesystem::path& dir, bool fake_clock = false);
};

// Copies examples/repos/<name> to `dest` and makes it a git repository with one commit.
// Returns "" or an error message.
std::string make_example_repo(const std::string& name, const std::filesystem::path& dest);

// Runs a shell command (test setup only), returns its exit code.
int shell(const std::string& command);
std::string read_file(const std::filesystem::path& path);

}  // namespace kiln::agent::testing
