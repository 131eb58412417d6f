// The lease keeper and the store event sink against a real SQLite store.
#include "agent/lease.h"

#include <gtest/gtest.h>

#include <thread>

#include "agent/store_events.h"
#include "test_support.h"

namespace kiln::agent {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;
using testing::TestStore;

store::Build submit_and_claim(store::Store& s, int64_t lease_ms = 60'000) {
  store::BuildSpec spec;
  spec.repo = "/nowhere";
  spec.task = "do it";
  spec.model = "scripted";
  EXPECT_TRUE(s.submit(spec).ok());
  auto claimed = s.claim({"test/worker-0", lease_ms, {}});
  EXPECT_TRUE(claimed.ok() && claimed.value().has_value());
  return *claimed.value();
}

bool wait_for(const StopSignal& stop, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!stop.requested() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  return stop.requested();
}

TEST(LeaseKeeper, cancel_requested_in_store_stops_the_build) {
  TempDir dir;
  TestStore ts(dir.path());
  auto build = submit_and_claim(*ts.store);
  StopSignal stop;
  LeaseKeeper keeper(*ts.store, build.id, build.attempt, 60'000, 20ms, stop);
  EXPECT_FALSE(stop.requested());
  ASSERT_TRUE(ts.store->cancel(build.id).ok());
  ASSERT_TRUE(wait_for(stop, 2s));
  EXPECT_EQ(stop.cause(), StopCause::cancelled);
}

TEST(LeaseKeeper, lost_lease_stops_the_build_and_fences_its_events) {
  TempDir dir;
  TestStore ts(dir.path(), /*fake_clock=*/true);
  auto first = submit_and_claim(*ts.store, 1'000);
  StoreEventSink old_sink(*ts.store, first.id, first.attempt);
  EXPECT_TRUE(old_sink.emit("log", {{"message", "attempt 1 working"}}));
  // The lease expires, recovery requeues the build and another worker claims it (attempt 2).
  ts.clock->fetch_add(10'000);
  ASSERT_TRUE(ts.store->recover().ok());
  auto second = ts.store->claim({"test/worker-1", 60'000, {}});
  ASSERT_TRUE(second.ok() && second.value().has_value());
  EXPECT_EQ((*second.value()).attempt, 2);

  StopSignal stop;
  LeaseKeeper keeper(*ts.store, first.id, first.attempt, 1'000, 20ms, stop);
  ASSERT_TRUE(wait_for(stop, 2s));
  EXPECT_EQ(stop.cause(), StopCause::lease_lost);
  EXPECT_FALSE(old_sink.emit("log", {{"message", "attempt 1 still talking"}}));
  auto events = ts.store->read_events(first.id, 0, 100);
  ASSERT_TRUE(events.ok());
  for (const auto& e : events.value()) EXPECT_EQ(e.payload_json.find("still talking"), std::string::npos);
}

}  // namespace
}  // namespace kiln::agent
