// Helpers for the store tests: a temporary directory inside the build tree and a manual clock.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "store/store.h"

namespace kiln::store {
// Readable names in GoogleTest failure messages.
inline void PrintTo(BuildStatus s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(OutcomeReason r, std::ostream* os) { *os << to_string(r); }
inline void PrintTo(ErrorCode c, std::ostream* os) { *os << to_string(c); }
}  // namespace kiln::store

namespace kiln::store::testing {

// A fresh directory under <build>/test-tmp, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::filesystem::path base = std::filesystem::path(KILN_BINARY_DIR) / "test-tmp";
    std::filesystem::create_directories(base);
    std::string pattern = (base / "store-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed in " + base.string());
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Time that moves only when a test says so (milliseconds since the epoch).
struct ManualClock {
  std::shared_ptr<std::atomic<int64_t>> ms = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  std::function<int64_t()> fn() const {
    auto p = ms;
    return [p] { return p->load(); };
  }
  void advance(int64_t delta_ms) { ms->fetch_add(delta_ms); }
  int64_t now() const { return ms->load(); }
};

inline BuildSpec spec(std::string task = "make the tests pass", std::string model = "qwen-a") {
  BuildSpec s;
  s.repo = "/srv/repos/demo";
  s.ref = "main";
  s.task = std::move(task);
  s.verify = "make test";
  s.model = std::move(model);
  s.limits = {50, 100000, 3600};
  return s;
}

inline std::unique_ptr<Store> open_store(const std::string& path, const ManualClock* clock = nullptr,
                                         int max_attempts = 3) {
  StoreOptions options;
  options.path = path;
  options.max_attempts = max_attempts;
  if (clock) options.now_ms = clock->fn();
  Result<std::unique_ptr<Store>> store = Store::open(options);
  if (!store) ADD_FAILURE() << "open " << path << ": " << store.error().message;
  return store ? std::move(*store) : nullptr;
}

#define ASSERT_OK(expr)                                          \
  do {                                                           \
    auto&& _r = (expr);                                          \
    ASSERT_TRUE(_r.ok()) << #expr << ": " << _r.error().message; \
  } while (0)

inline ClaimRequest claimer(std::string owner = "worker-1", int64_t lease_ms = 60'000) {
  ClaimRequest r;
  r.owner = std::move(owner);
  r.lease_ms = lease_ms;
  return r;
}

}  // namespace kiln::store::testing
