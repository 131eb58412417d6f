// LeaseKeeper: keeps one claimed build's lease alive while a worker carries it, and turns what
// the store says into the build's StopSignal:
//   heartbeat ok, cancel_requested  → StopCause::cancelled
//   heartbeat fenced / not_found    → StopCause::lease_lost (stop at once; write nothing more)
//   heartbeat failing (busy, disk) past the lease expiry → StopCause::lease_lost
// Owns one thread from construction to destruction (RAII); the first heartbeat runs before the
// constructor returns, so a build cancelled while queued-then-claimed stops before any work.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "agent/stop_signal.h"
#include "store/store.h"

namespace kiln::agent {

class LeaseKeeper {
 public:
  LeaseKeeper(store::Store& store, int64_t build_id, int attempt, int64_t lease_ms,
              std::chrono::milliseconds interval, StopSignal& stop);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

 private:
  void beat();
  store::Store& store_;
  const int64_t build_id_;
  const int attempt_;
  const int64_t lease_ms_;
  const std::chrono::milliseconds interval_;
  StopSignal& stop_;
  std::chrono::steady_clock::time_point renewed_;  // owned by the keeper thread after start
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace kiln::agent
