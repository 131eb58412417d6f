// EventHub over an in-memory feed and a sink that drains only when the test reads it, so how
// much the hub queues ahead of a client is under the test's control.
#include "server/event_hub.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

namespace kiln::server {
namespace {

// A finished build with events 1..count of about `bytes` each.
class FinishedBuildFeed : public EventFeed {
 public:
  FinishedBuildFeed(int64_t count, size_t bytes) : count_(count), text_(bytes, 'x') {}
  std::optional<std::string> read(const std::string&, int64_t after, int limit, FeedPage& page) override {
    page.events.clear();
    page.terminal = true;
    page.end_json = R"({"status":"succeeded","reason":"no_verify"})";
    for (int64_t seq = after + 1; seq <= count_ && seq <= after + limit; ++seq) {
      page.events.push_back({seq, "log", R"({"text":")" + text_ + R"("})"});
    }
    return std::nullopt;
  }

 private:
  int64_t count_;
  std::string text_;
};

class ReadOnDemandSink : public SseSink {
 public:
  bool open() const override {
    std::lock_guard lock(mu_);
    return !closed_;
  }
  size_t buffered_bytes() const override {
    std::lock_guard lock(mu_);
    return queued_.size();
  }
  void send(std::string bytes) override {
    std::lock_guard lock(mu_);
    queued_ += bytes;
    max_queued_ = std::max(max_queued_, queued_.size());
  }
  void close(bool flush) override {
    std::lock_guard lock(mu_);
    closed_ = true;
    flushed_ = flush;
    if (!flush) queued_.clear();
  }
  // The client reads everything queued so far.
  void read() {
    std::lock_guard lock(mu_);
    received_ += queued_;
    queued_.clear();
  }
  bool closed() const { return !open(); }
  bool flushed() const {
    std::lock_guard lock(mu_);
    return flushed_;
  }
  std::string received() const {
    std::lock_guard lock(mu_);
    return received_;
  }
  size_t max_queued() const {
    std::lock_guard lock(mu_);
    return max_queued_;
  }

 private:
  mutable std::mutex mu_;
  std::string queued_, received_;
  size_t max_queued_ = 0;
  bool closed_ = false, flushed_ = false;
};

TEST(EventHub, ReplayOfMoreThanTheBufferPausesInsteadOfDroppingAndEndsWithEnd) {
  // One page of 200 events (~200 KiB) against a 16 KiB buffer: the hub used to queue the whole
  // page in one pass and drop the client once the queue passed the limit, with no `end`.
  FinishedBuildFeed feed(200, 1000);
  HubOptions options;
  options.poll_interval = std::chrono::milliseconds(5);
  options.buffer_limit_bytes = 16 * 1024;
  EventHub hub(feed, options);
  auto sink = std::make_shared<ReadOnDemandSink>();
  hub.subscribe("1", 0, sink);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!sink->closed() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    sink->read();
  }
  sink->read();
  ASSERT_TRUE(sink->closed());
  EXPECT_TRUE(sink->flushed()) << "dropped instead of ended";
  EXPECT_EQ(hub.dropped_count(), 0u);
  EXPECT_LE(sink->max_queued(), options.buffer_limit_bytes);

  std::string got = sink->received();
  std::string lines = "\n" + got;
  std::vector<int64_t> seqs;
  for (size_t pos = lines.find("\nid: "); pos != std::string::npos; pos = lines.find("\nid: ", pos + 1)) {
    seqs.push_back(std::stoll(lines.substr(pos + 5)));
  }
  std::vector<int64_t> expected;
  for (int64_t seq = 1; seq <= 200; ++seq) expected.push_back(seq);
  EXPECT_EQ(seqs, expected);
  std::string end = "event: end\ndata: {\"status\":\"succeeded\",\"reason\":\"no_verify\"}\n\n";
  ASSERT_GE(got.size(), end.size());
  EXPECT_EQ(got.substr(got.size() - end.size()), end);
}

TEST(EventHub, AClientThatNeverReadsIsDroppedAfterTheStallTimeout) {
  FinishedBuildFeed feed(200, 1000);
  HubOptions options;
  options.poll_interval = std::chrono::milliseconds(5);
  options.buffer_limit_bytes = 16 * 1024;
  options.stall_timeout = std::chrono::milliseconds(200);
  EventHub hub(feed, options);
  auto sink = std::make_shared<ReadOnDemandSink>();
  auto t0 = std::chrono::steady_clock::now();
  hub.subscribe("1", 0, sink);
  while (!sink->closed() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(sink->closed());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, options.stall_timeout);  // paused first, not dropped at once
  EXPECT_FALSE(sink->flushed());
  EXPECT_EQ(hub.dropped_count(), 1u);
  EXPECT_LE(sink->max_queued(), options.buffer_limit_bytes);
}

}  // namespace
}  // namespace kiln::server
