// Opening a Store: the file, the connection pragmas, migrations, the reader pool and the
// in-process wake-ups. The queue, events, metrics and comparisons live in their own files.
#include <filesystem>
#include <system_error>

#include "store/migrations.h"
#include "store/store_impl.h"

namespace kiln::store {

// ---- Notifier -------------------------------------------------------------------------------

void Notifier::on_work() {
  {
    std::lock_guard lock(mu);
    ++work_epoch;
  }
  cv.notify_all();
}

void Notifier::on_event(int64_t build_id, int64_t seq, bool terminal) {
  // Keeps latest_seq bounded: a terminal build gets no more events, so its entry can go once
  // enough later builds have finished (a waiter that finds no entry falls back to polling).
  constexpr size_t kKeepFinished = 4096;
  {
    std::lock_guard lock(mu);
    int64_t& latest = latest_seq[build_id];
    if (seq > latest) latest = seq;
    if (terminal) {
      finished.push_back(build_id);
      if (finished.size() > kKeepFinished) {
        latest_seq.erase(finished.front());
        finished.pop_front();
      }
    }
  }
  cv.notify_all();
}

void Notifier::wake_all() {
  { std::lock_guard lock(mu); }
  cv.notify_all();
}

std::shared_ptr<Notifier> notifier_for(const std::string& canonical_path) {
  static std::mutex registry_mu;
  static std::unordered_map<std::string, std::weak_ptr<Notifier>> registry;  // by registry_mu
  std::lock_guard lock(registry_mu);
  std::weak_ptr<Notifier>& slot = registry[canonical_path];
  std::shared_ptr<Notifier> notifier = slot.lock();
  if (!notifier) {
    notifier = std::make_shared<Notifier>();
    slot = notifier;
  }
  return notifier;
}

// ---- Impl -----------------------------------------------------------------------------------

int64_t Store::Impl::now_ms() const {
  if (options.now_ms) return options.now_ms();
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

Store::Impl::ReaderLease::~ReaderLease() {
  constexpr size_t kMaxIdleReaders = 8;
  if (!db_) return;
  db_->rollback_if_open();  // never pool a connection stuck in an old snapshot
  std::lock_guard lock(impl_->readers_mu);
  if (impl_->idle_readers.size() < kMaxIdleReaders) impl_->idle_readers.push_back(std::move(db_));
}

Result<Store::Impl::ReaderLease> Store::Impl::reader() {
  {
    std::lock_guard lock(readers_mu);
    if (!idle_readers.empty()) {
      std::unique_ptr<detail::Db> db = std::move(idle_readers.back());
      idle_readers.pop_back();
      return ReaderLease(this, std::move(db));
    }
  }
  Result<std::unique_ptr<detail::Db>> db =
      detail::Db::open(options.path, options.busy_timeout_ms, /*read_only=*/true);
  if (!db) return db.error();
  return ReaderLease(this, std::move(*db));
}

// ---- Store ----------------------------------------------------------------------------------

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() { stop_waiting(); }

Result<std::unique_ptr<Store>> Store::open(StoreOptions options) {
  if (options.path.empty()) return Error{ErrorCode::invalid_argument, "database path is empty", "path"};
  if (options.path == ":memory:" || options.path.rfind("file:", 0) == 0) {
    // The writer and the pooled readers are separate connections: they must share a file.
    return Error{ErrorCode::invalid_argument,
                 "database path must be a file path (not :memory: or a file: URI): " + options.path, "path"};
  }
  if (options.max_attempts < 1) {
    return Error{ErrorCode::invalid_argument, "max_attempts must be at least 1", "max_attempts"};
  }
  if (options.busy_timeout_ms < 0) {
    return Error{ErrorCode::invalid_argument, "busy_timeout_ms must not be negative", "busy_timeout_ms"};
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path parent = fs::path(options.path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) {
      return Error{ErrorCode::io,
                   "cannot create directory " + parent.string() + " for the database: " + ec.message(),
                   "path"};
    }
  }

  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  Result<std::unique_ptr<detail::Db>> writer =
      detail::Db::open(impl->options.path, impl->options.busy_timeout_ms, /*read_only=*/false);
  if (!writer) return writer.error();
  impl->writer = std::move(*writer);
  if (Status s = Impl::retry_busy([&] { return detail::migrate(*impl->writer); }); !s) {
    return s.error();
  }

  fs::path canonical = fs::weakly_canonical(fs::absolute(impl->options.path, ec), ec);
  impl->canonical_path = ec ? impl->options.path : canonical.string();
  impl->notifier = notifier_for(impl->canonical_path);

  std::unique_ptr<Store> store(new Store(std::move(impl)));
  if (store->impl_->options.recover_on_open) {
    if (Result<RecoveryReport> r = store->recover(); !r) return r.error();
  }
  return store;
}

void Store::stop_waiting() {
  if (!impl_) return;
  impl_->stopped.store(true);
  impl_->notifier->wake_all();
}

int64_t Store::now_ms() const { return impl_->now_ms(); }
const std::string& Store::path() const { return impl_->options.path; }

uint64_t Store::work_epoch() const {
  std::lock_guard lock(impl_->notifier->mu);
  return impl_->notifier->work_epoch;
}

bool Store::wait_for_work(uint64_t seen, std::chrono::milliseconds timeout) {
  Notifier& n = *impl_->notifier;
  std::unique_lock lock(n.mu);
  n.cv.wait_for(lock, timeout, [&] { return n.work_epoch != seen || impl_->stopped.load(); });
  return n.work_epoch != seen && !impl_->stopped.load();
}

}  // namespace kiln::store
