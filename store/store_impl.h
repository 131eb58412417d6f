// Internal to store/: the state behind a Store and helpers shared by queue.cpp, events.cpp,
// metrics.cpp and compare.cpp.
//
// Ownership and locks:
//   writer       — the one write connection; used only while holding writer_mu.
//   idle_readers — reader connections not in use; guarded by readers_mu. A reader taken from
//                  the pool is owned by one thread until its ReaderLease returns it.
//   Notifier     — shared by every Store of this process on the same file; its fields are
//                  guarded by Notifier::mu. No lock is held across SQLite I/O except writer_mu,
//                  whose whole purpose is to serialize this Store's writes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "store/sqlite_db.h"
#include "store/store.h"

namespace kiln::store {

struct Notifier {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t work_epoch = 0;                          // bumped on submit and requeue
  std::unordered_map<int64_t, int64_t> latest_seq;  // build id -> last appended seq
  std::deque<int64_t> finished;                     // terminal builds, oldest first, to prune latest_seq

  void on_work();
  void on_event(int64_t build_id, int64_t seq, bool terminal);
  void wake_all();
};

// The Notifier for `canonical_path`, shared by all Stores of this process on that file.
std::shared_ptr<Notifier> notifier_for(const std::string& canonical_path);

struct Store::Impl {
  StoreOptions options;
  std::string canonical_path;

  std::mutex writer_mu;
  std::unique_ptr<detail::Db> writer;  // guarded by writer_mu

  std::mutex readers_mu;
  std::vector<std::unique_ptr<detail::Db>> idle_readers;  // guarded by readers_mu

  std::shared_ptr<Notifier> notifier;
  std::atomic<bool> stopped{false};

  int64_t now_ms() const;

  // A reader connection for the lifetime of the lease.
  class ReaderLease {
   public:
    ReaderLease(Impl* impl, std::unique_ptr<detail::Db> db) : impl_(impl), db_(std::move(db)) {}
    ReaderLease(ReaderLease&&) = default;
    ~ReaderLease();
    detail::Db& db() { return *db_; }

   private:
    Impl* impl_;
    std::unique_ptr<detail::Db> db_;
  };
  Result<ReaderLease> reader();

  // Runs fn(writer) under writer_mu; fn opens its own transaction. A busy error (the lock stayed
  // taken past the busy timeout, or an injected fault) is retried a few times, which is safe
  // because a failed transaction has been rolled back and changed nothing.
  template <class F>
  auto write(F&& fn) -> decltype(fn(*writer)) {
    std::lock_guard lock(writer_mu);
    return retry_busy([&] { return fn(*writer); });
  }
  // Runs fn(reader) on a pooled reader connection, retrying busy errors the same way.
  template <class F>
  auto read(F&& fn) -> decltype(fn(*writer)) {
    return retry_busy([&]() -> decltype(fn(*writer)) {
      Result<ReaderLease> lease = reader();
      if (!lease) return lease.error();
      return fn(lease->db());
    });
  }
  template <class F>
  static auto retry_busy(F&& fn) -> decltype(fn()) {
    for (int tries = 1;; ++tries) {
      auto result = fn();
      if (result.ok() || result.error().code != ErrorCode::busy || tries == kWriteTries) {
        return result;
      }
    }
  }
  static constexpr int kWriteTries = 3;
};

namespace detail {

// "SELECT <all build columns> FROM builds b JOIN build_metrics m ..." — append WHERE/ORDER.
std::string build_select(bool include_diff);
Build read_build(const Query& q);  // a row of build_select(), in its column order
Result<Build> load_build(Db& db, int64_t build_id, bool include_diff);

// Inserts the build's next event (no fencing: callers check ownership). Returns the seq.
// An event kind of 1..64 bytes and a payload that is JSON, else the error naming the field.
std::optional<Error> validate_event(std::string_view kind, std::string_view payload_json);
Result<int64_t> insert_event(Db& db, int64_t build_id, int attempt, int64_t ts_ms, std::string_view kind,
                             std::string_view payload_json);
// A `status` event describing `build` as it is now. Returns the seq.
Result<int64_t> insert_status_event(Db& db, const Build& build, int64_t ts_ms);

// Why a fenced write matched no row: not_found, or fenced with the build's current state.
Error fence_error(Db& db, int64_t build_id, int attempt, std::string_view operation);

std::string metrics_tool_calls_json(const std::map<std::string, int64_t>& tool_calls);
std::map<std::string, int64_t> parse_tool_calls_json(const std::string& json);

}  // namespace detail
}  // namespace kiln::store
