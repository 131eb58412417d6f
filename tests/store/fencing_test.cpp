// Fencing: a worker whose lease expired and whose build was claimed again can no longer write.
#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

TEST(StoreFencing, TheOldAttemptsFinishAppendsHeartbeatAndMetricsAreRejected) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t id = store->submit(spec())->id;
  Build old_claim = **store->claim(claimer("worker-old", 1000));
  ASSERT_OK(store->append_event(id, old_claim.attempt, "log", R"({"line":"old 1"})"));

  clock.advance(1500);  // worker-old stalls past its lease
  ASSERT_EQ(store->recover()->requeued, 1);
  Build new_claim = **store->claim(claimer("worker-new", 60'000));
  EXPECT_EQ(new_claim.attempt, old_claim.attempt + 1);
  EXPECT_EQ(new_claim.lease_owner, std::optional<std::string>("worker-new"));
  size_t events_before = store->read_events(id, 0)->size();

  FinishRequest done;
  done.status = BuildStatus::succeeded;
  done.reason = OutcomeReason::verified;
  Result<Build> stale_finish = store->finish(id, old_claim.attempt, done);
  ASSERT_FALSE(stale_finish.ok());
  EXPECT_EQ(stale_finish.error().code, ErrorCode::fenced);
  EXPECT_NE(stale_finish.error().message.find("attempt 2"), std::string::npos)
      << stale_finish.error().message;
  EXPECT_EQ(store->append_event(id, old_claim.attempt, "log", "{}").error().code, ErrorCode::fenced);
  EXPECT_EQ(store->heartbeat(id, old_claim.attempt, 1000).error().code, ErrorCode::fenced);
  BuildMetrics delta;
  delta.tokens_generated = 5;
  EXPECT_EQ(store->add_metrics(id, old_claim.attempt, delta).error().code, ErrorCode::fenced);

  // Nothing of the stale writes landed; the new owner's record is intact and it can finish.
  Build now = *store->get(id);
  EXPECT_EQ(now.status, BuildStatus::running);
  EXPECT_EQ(now.lease_owner, std::optional<std::string>("worker-new"));
  EXPECT_EQ(now.metrics.tokens_generated, 0);
  EXPECT_EQ(store->read_events(id, 0)->size(), events_before);
  ASSERT_OK(store->append_event(id, new_claim.attempt, "log", R"({"line":"new"})"));
  Result<Build> finished = store->finish(id, new_claim.attempt, done);
  ASSERT_OK(finished);
  EXPECT_EQ(finished->status, BuildStatus::succeeded);
  EXPECT_EQ(store->finish(id, old_claim.attempt, done).error().code, ErrorCode::fenced);
}

}  // namespace
}  // namespace kiln::store
