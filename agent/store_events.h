// StoreEventSink: the loop's EventSink over the store's event log, for one attempt of one build.
// Appends are fenced by the attempt: when the store answers `fenced` (the lease was lost and the
// build claimed again, or it was finished) emit() returns false and the loop stops. Other store
// errors (busy, disk) are kept as last_error() and counted, never dropped silently; the build
// goes on, since losing a log line must not lose a build.
// Threading: emit() may be called from any thread (the store serialises writes).
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "agent/events.h"
#include "store/store.h"

namespace kiln::agent {

class StoreEventSink final : public EventSink {
 public:
  StoreEventSink(store::Store& store, int64_t build_id, int attempt);
  bool emit(std::string_view kind, const Json& payload) override;
  int64_t failed_appends() const { return failed_.load(); }
  std::string last_error() const;

 private:
  store::Store& store_;
  const int64_t build_id_;
  const int attempt_;
  std::atomic<int64_t> failed_{0};
  mutable std::mutex mutex_;
  std::string last_error_;  // guarded by mutex_
};

}  // namespace kiln::agent
