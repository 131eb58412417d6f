#include "server/event_hub.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "server/sse.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;

EventHub::EventHub(EventFeed& feed, HubOptions options) : feed_(feed), options_(options) {
  thread_ = std::thread([this] { run(); });
}

EventHub::~EventHub() { stop(); }

void EventHub::subscribe(const std::string& build_id, int64_t after_seq, std::shared_ptr<SseSink> sink) {
  Subscriber sub{std::move(sink), after_seq, Clock::now(), std::nullopt};
  std::lock_guard lock(mu_);
  if (stopping_) {
    sub.sink->close(false);
    return;
  }
  incoming_.emplace_back(build_id, std::move(sub));
  kicked_ = true;
  wake_.notify_one();
}

void EventHub::notify() {
  std::lock_guard lock(mu_);
  kicked_ = true;
  wake_.notify_one();
}

void EventHub::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

size_t EventHub::subscriber_count() const {
  std::lock_guard lock(mu_);
  return active_count_ + incoming_.size();
}

uint64_t EventHub::dropped_count() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

void EventHub::run() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, options_.poll_interval, [this] { return stopping_ || kicked_; });
      kicked_ = false;
      if (stopping_) break;
      for (auto& [id, sub] : incoming_) active_[id].push_back(std::move(sub));
      incoming_.clear();
    }
    // No lock from here on: the table is the hub thread's, and feed/sink calls may block.
    size_t count = 0;
    for (auto it = active_.begin(); it != active_.end();) {
      pump_build(it->first, it->second);
      ping_idle(it->second);
      std::erase_if(it->second, [](const Subscriber& s) { return s.sink == nullptr; });
      count += it->second.size();
      it = it->second.empty() ? active_.erase(it) : std::next(it);
    }
    std::lock_guard lock(mu_);
    active_count_ = count;
  }
  // Shutting down: close every stream; clients resume with Last-Event-ID against the next server.
  std::vector<Subscriber> pending;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, sub] : incoming_) pending.push_back(std::move(sub));
    incoming_.clear();
    active_count_ = 0;
  }
  for (auto& [id, subs] : active_)
    for (Subscriber& s : subs) pending.push_back(std::move(s));
  active_.clear();
  for (Subscriber& s : pending) s.sink->close(false);
}

bool EventHub::deliver(Subscriber& sub, const std::string& bytes) {
  if (sub.sink->buffered_bytes() + bytes.size() > options_.buffer_limit_bytes) {
    sub.sink->close(false);  // a slow client: drop it, never grow without bound
    sub.sink = nullptr;
    std::lock_guard lock(mu_);
    ++dropped_;
    return false;
  }
  sub.sink->send(bytes);
  sub.last_send = Clock::now();
  return true;
}

void EventHub::pump_build(const std::string& build_id, std::vector<Subscriber>& subs) {
  Clock::time_point now = Clock::now();
  // Who can take more now? Gone clients are removed; full ones pause (and are dropped if stuck).
  int64_t from = INT64_MAX;
  for (Subscriber& s : subs) {
    if (!s.sink->open()) {
      s.sink = nullptr;
      continue;
    }
    if (s.sink->buffered_bytes() > options_.buffer_limit_bytes / 2) {
      if (!s.paused_since) s.paused_since = now;
      if (now - *s.paused_since > options_.stall_timeout) {
        s.sink->close(false);
        s.sink = nullptr;
        std::lock_guard lock(mu_);
        ++dropped_;
      }
      continue;
    }
    s.paused_since.reset();
    from = std::min(from, s.last_seq);
  }
  if (from == INT64_MAX) return;  // nobody ready

  FeedPage page;
  if (auto err = feed_.read(build_id, from, options_.page_limit, page)) {
    // The build vanished or the store failed: tell the client why and end the stream.
    std::string frame = sse_frame(std::nullopt, "error", nlohmann::json{{"message", *err}}.dump());
    for (Subscriber& s : subs) {
      if (s.sink == nullptr) continue;
      s.sink->send(frame);
      s.sink->close(true);
      s.sink = nullptr;
    }
    return;
  }
  for (const FeedEvent& ev : page.events) {
    std::string frame;
    for (Subscriber& s : subs) {
      if (s.sink == nullptr || s.paused_since || s.last_seq >= ev.seq) continue;
      if (frame.empty()) frame = sse_frame(ev.seq, ev.kind, ev.json);
      // A page can hold far more than the buffer (a replay from the start): the pause rule holds
      // per event, so a subscriber takes what fits and the rest on a later pump, once it drained.
      size_t buffered = s.sink->buffered_bytes();
      if (buffered > options_.buffer_limit_bytes / 2 ||
          (buffered > 0 && buffered + frame.size() > options_.buffer_limit_bytes)) {
        s.paused_since = now;
        continue;
      }
      if (deliver(s, frame)) s.last_seq = ev.seq;
    }
  }
  bool complete = page.terminal && static_cast<int>(page.events.size()) < options_.page_limit;
  if (!complete) return;
  std::string end = sse_frame(std::nullopt, "end", page.end_json);
  for (Subscriber& s : subs) {
    // Only those that had everything up to the page's end; a paused one finishes on a later pump.
    if (s.sink == nullptr || s.paused_since) continue;
    if (!page.events.empty() && s.last_seq < page.events.back().seq) continue;
    s.sink->send(end);
    s.sink->close(true);
    s.sink = nullptr;
  }
}

void EventHub::ping_idle(std::vector<Subscriber>& subs) {
  Clock::time_point now = Clock::now();
  for (Subscriber& s : subs) {
    if (s.sink == nullptr || now - s.last_send < options_.ping_interval) continue;
    deliver(s, sse_comment("ping"));
  }
}

}  // namespace kiln::server
