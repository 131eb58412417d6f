#include "agent/lease.h"

#include <iostream>

namespace kiln::agent {

LeaseKeeper::LeaseKeeper(store::Store& store, int64_t build_id, int attempt, int64_t lease_ms,
                         std::chrono::milliseconds interval, StopSignal& stop)
    : store_(store), build_id_(build_id), attempt_(attempt), lease_ms_(lease_ms), interval_(interval), stop_(stop),
      renewed_(std::chrono::steady_clock::now()) {
  beat();
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, interval_, [this] { return done_; })) {
      lock.unlock();  // no lock held across the store call
      beat();
      lock.lock();
    }
  });
}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LeaseKeeper::beat() {
  auto reply = store_.heartbeat(build_id_, attempt_, lease_ms_);
  auto now = std::chrono::steady_clock::now();
  if (reply.ok()) {
    renewed_ = now;
    if (reply->cancel_requested) stop_.request(StopCause::cancelled);
    return;
  }
  auto code = reply.error().code;
  if (code == store::ErrorCode::fenced || code == store::ErrorCode::not_found || code == store::ErrorCode::conflict) {
    stop_.request(StopCause::lease_lost);
    return;
  }
  std::cerr << "level=warn component=agent build=" << build_id_ << " msg=\"heartbeat failed\" error=\""
            << reply.error().message << "\"\n";
  if (now - renewed_ >= std::chrono::milliseconds(lease_ms_)) stop_.request(StopCause::lease_lost);
}

}  // namespace kiln::agent
