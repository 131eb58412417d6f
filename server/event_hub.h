// EventHub: the one thread that reads build events from the store and fans them out to every
// live SSE client. One query per watched build per wake-up serves all of that build's watchers.
//
// Ownership and threads:
//   - subscribe()/stop()/subscriber_count() may be called from any thread (they take mu_).
//   - The hub thread alone owns the active subscriber table and calls the EventFeed and the sinks.
//   - Sinks are implemented by the network session; their methods must be thread-safe (the
//     session posts onto its own strand).
// Guarantees per subscriber: events in seq order, each seq > its start position exactly once
// (no gap, no duplicate), then `end` once the build is terminal and every event was sent.
// Bounded memory: a sink holding more than half its buffer is paused (not fed); one that would
// pass its limit, or stays paused longer than stall_timeout, is dropped (closed without flush).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kiln::server {

// Where events come from (implemented over the store; see store_feed.*).
struct FeedEvent {
  int64_t seq = 0;
  std::string kind;
  std::string json;  // the event as the API shows it
};
struct FeedPage {
  std::vector<FeedEvent> events;
  bool terminal = false;   // status was terminal *before* the events were read
  std::string end_json;    // when terminal: {"status":..,"reason":..}
};
class EventFeed {
 public:
  virtual ~EventFeed() = default;
  // Events with seq > after (at most `limit`). An error names the build or the store failure.
  virtual std::optional<std::string> read(const std::string& build_id, int64_t after, int limit,
                                          FeedPage& page) = 0;
};

// The client end of one SSE stream (implemented by the network session).
class SseSink {
 public:
  virtual ~SseSink() = default;
  virtual bool open() const = 0;               // false once the client went away
  virtual size_t buffered_bytes() const = 0;   // queued, not yet written to the socket
  virtual void send(std::string bytes) = 0;    // queue bytes for writing
  virtual void close(bool flush) = 0;          // flush: after the queued bytes (end); else now
};

struct HubOptions {
  std::chrono::milliseconds poll_interval{100};  // latency bound when nobody wakes the hub
  std::chrono::milliseconds ping_interval{15000};
  std::chrono::milliseconds stall_timeout{30000};
  size_t buffer_limit_bytes = 1 << 20;
  int page_limit = 256;
};

class EventHub {
 public:
  EventHub(EventFeed& feed, HubOptions options);
  ~EventHub();  // stop()
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  // Streams events of `build_id` with seq > after_seq into `sink`.
  void subscribe(const std::string& build_id, int64_t after_seq, std::shared_ptr<SseSink> sink);
  // Wakes the hub now (e.g. the store reported an append); cheap, callable from any thread.
  void notify();
  // Closes every sink (without `end`) and joins the thread. Idempotent.
  void stop();
  size_t subscriber_count() const;
  uint64_t dropped_count() const;

 private:
  struct Subscriber {
    std::shared_ptr<SseSink> sink;
    int64_t last_seq = 0;
    std::chrono::steady_clock::time_point last_send;
    std::optional<std::chrono::steady_clock::time_point> paused_since;
  };
  void run();
  void pump_build(const std::string& build_id, std::vector<Subscriber>& subs);
  void ping_idle(std::vector<Subscriber>& subs);
  bool deliver(Subscriber& sub, const std::string& bytes);

  EventFeed& feed_;
  const HubOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::pair<std::string, Subscriber>> incoming_;  // guarded by mu_
  bool stopping_ = false;                                     // guarded by mu_
  bool kicked_ = false;                                       // guarded by mu_
  size_t active_count_ = 0;                                   // guarded by mu_
  uint64_t dropped_ = 0;                                      // guarded by mu_
  std::map<std::string, std::vector<Subscriber>> active_;     // hub thread only
  std::thread thread_;
};

}  // namespace kiln::server
