// StopSignal: the one flag that stops a build's model call and running tool promptly.
// Set from any thread (the lease heartbeat on cancel or lost lease, the wall-time watchdog,
// the pool on shutdown); read by the loop, the ChatModel (between tokens) and the tools (the
// sandbox polls it). The first cause wins and is kept, so the outcome names the real reason.
#pragma once

#include <atomic>
#include <string_view>

namespace kiln::agent {

enum class StopCause : int { none = 0, cancelled, lease_lost, time_limit, shutdown };

inline std::string_view stop_cause_name(StopCause c) {
  switch (c) {
    case StopCause::none: return "none";
    case StopCause::cancelled: return "cancelled";
    case StopCause::lease_lost: return "lease_lost";
    case StopCause::time_limit: return "time_limit";
    case StopCause::shutdown: return "shutdown";
  }
  return "unknown";
}

class StopSignal {
 public:
  // Thread-safe. Returns true when this call set the cause (the first one wins).
  bool request(StopCause cause) {
    int expected = 0;
    bool first = cause_.compare_exchange_strong(expected, static_cast<int>(cause));
    flag_.store(true);
    return first;
  }
  bool requested() const { return flag_.load(std::memory_order_relaxed); }
  StopCause cause() const { return static_cast<StopCause>(cause_.load()); }
  // The raw flag, for APIs (engine generate, sandbox run) that poll an atomic<bool>.
  const std::atomic<bool>& flag() const { return flag_; }

 private:
  std::atomic<bool> flag_{false};
  std::atomic<int> cause_{0};
};

}  // namespace kiln::agent
