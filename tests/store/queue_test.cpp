// The queue's transitions (store/queue.cpp): submit, claim order, heartbeat, finish, cancel,
// recovery, list and stats.
#include <thread>

#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;
using std::chrono::milliseconds;

TEST(StoreQueue, SubmitThenGetRoundTripsTheSpec) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  BuildSpec s = spec("fix the parser");
  s.priority = 7;
  Result<Build> submitted = store->submit(s);
  ASSERT_OK(submitted);
  Result<Build> got = store->get(submitted->id);
  ASSERT_OK(got);
  EXPECT_EQ(got->spec.repo, s.repo);
  EXPECT_EQ(got->spec.ref, "main");
  EXPECT_EQ(got->spec.task, "fix the parser");
  EXPECT_EQ(got->spec.verify, std::optional<std::string>("make test"));
  EXPECT_EQ(got->spec.model, "qwen-a");
  EXPECT_EQ(got->spec.limits.max_steps, 50);
  EXPECT_EQ(got->spec.limits.max_tokens, 100000);
  EXPECT_EQ(got->spec.limits.max_wall_s, 3600);
  EXPECT_EQ(got->spec.priority, 7);
  EXPECT_EQ(got->status, BuildStatus::queued);
  EXPECT_EQ(got->attempt, 0);
  EXPECT_EQ(got->created_ms, clock.now());
  EXPECT_FALSE(got->finished_ms);
  EXPECT_EQ(got->task_key, task_key(s));
  EXPECT_EQ(store->get(submitted->id + 100).error().code, ErrorCode::not_found);
}

TEST(StoreQueue, ClaimTakesHighestPriorityThenOldest) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  std::vector<int64_t> ids;
  for (int priority : {0, 5, 0, 5}) {
    BuildSpec s = spec();
    s.priority = priority;
    ids.push_back(store->submit(s)->id);
    clock.advance(10);
  }
  std::vector<int64_t> order;
  for (int i = 0; i < 4; ++i) {
    Result<std::optional<Build>> c = store->claim(claimer());
    ASSERT_OK(c);
    ASSERT_TRUE(c->has_value());
    EXPECT_EQ((*c)->status, BuildStatus::running);
    EXPECT_EQ((*c)->attempt, 1);
    EXPECT_EQ((*c)->lease_owner, std::optional<std::string>("worker-1"));
    EXPECT_EQ((*c)->lease_expires_ms, std::optional<int64_t>(clock.now() + 60'000));
    order.push_back((*c)->id);
  }
  EXPECT_EQ(order, (std::vector<int64_t>{ids[1], ids[3], ids[0], ids[2]}));
  Result<std::optional<Build>> none = store->claim(claimer());
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
}

TEST(StoreQueue, ClaimRecordsQueueSecondsAndHonoursModelFilter) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t a = store->submit(spec("t", "qwen-a"))->id;
  int64_t b = store->submit(spec("t", "qwen-b"))->id;
  clock.advance(2500);
  ClaimRequest only_b = claimer();
  only_b.models = {"qwen-b", "qwen-c"};
  Result<std::optional<Build>> c = store->claim(only_b);
  ASSERT_OK(c);
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->id, b);
  EXPECT_DOUBLE_EQ((*c)->metrics.seconds_queue, 2.5);
  Result<std::optional<Build>> none = store->claim(only_b);
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(store->get(a)->status, BuildStatus::queued);
}

TEST(StoreQueue, HeartbeatRenewsLeaseAndReportsCancel) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer("w", 1000));
  clock.advance(800);
  Result<HeartbeatReply> hb = store->heartbeat(id, b.attempt, 1000);
  ASSERT_OK(hb);
  EXPECT_EQ(hb->lease_expires_ms, clock.now() + 1000);
  EXPECT_FALSE(hb->cancel_requested);
  clock.advance(800);  // past the first lease, inside the renewed one
  ASSERT_OK(store->recover());
  EXPECT_EQ(store->get(id)->status, BuildStatus::running);

  Result<CancelReply> cancel = store->cancel(id);
  ASSERT_OK(cancel);
  EXPECT_FALSE(cancel->immediate);
  EXPECT_TRUE(cancel->build.cancel_requested);
  hb = store->heartbeat(id, b.attempt, 1000);
  ASSERT_OK(hb);
  EXPECT_TRUE(hb->cancel_requested);
  FinishRequest done;
  done.status = BuildStatus::cancelled;
  done.reason = OutcomeReason::cancelled;
  Result<Build> finished = store->finish(id, b.attempt, done);
  ASSERT_OK(finished);
  EXPECT_EQ(finished->status, BuildStatus::cancelled);
}

TEST(StoreQueue, FinishWritesOutcomeResultAndFinalMetrics) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t id = store->submit(spec())->id;
  clock.advance(1000);
  Build b = **store->claim(claimer());
  clock.advance(5000);
  FinishRequest done;
  done.status = BuildStatus::succeeded;
  done.reason = OutcomeReason::verified;
  done.result_branch = "kiln/build-1";
  done.result_diff = "--- a/x\n+++ b/x\n";
  BuildMetrics m;
  m.tokens_prefilled = 1200;
  m.tokens_cached = 800;
  m.tokens_generated = 300;
  m.tokens_reasoning = 120;
  m.steps = 4;
  m.tool_calls = {{"shell", 3}, {"file_view", 2}};
  m.seconds_decode = 3.0;
  m.seconds_wall = 5.0;
  done.metrics = m;
  Result<Build> f = store->finish(id, b.attempt, done);
  ASSERT_OK(f);
  EXPECT_EQ(f->status, BuildStatus::succeeded);
  EXPECT_EQ(f->outcome, OutcomeReason::verified);
  EXPECT_EQ(f->finished_ms, std::optional<int64_t>(clock.now()));
  EXPECT_FALSE(f->lease_owner);
  EXPECT_EQ(f->result_branch, std::optional<std::string>("kiln/build-1"));
  EXPECT_EQ(f->result_diff, done.result_diff);
  EXPECT_EQ(f->metrics.tokens_generated, 300);
  EXPECT_EQ(f->metrics.tool_calls_total(), 5);
  EXPECT_EQ(f->metrics.tool_calls.at("shell"), 3);
  EXPECT_DOUBLE_EQ(f->metrics.seconds_queue, 1.0);  // kept: the store owns it
  EXPECT_DOUBLE_EQ(f->metrics.seconds_wall, 5.0);
  // A finished build cannot be finished again, even by its own attempt.
  EXPECT_EQ(store->finish(id, b.attempt, done).error().code, ErrorCode::fenced);
}

TEST(StoreQueue, HasDiffIsKnownWithoutLoadingTheDiff) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t with_diff = store->submit(spec("with diff"))->id;
  int64_t empty_diff = store->submit(spec("empty diff"))->id;
  int64_t queued = store->submit(spec("queued"))->id;
  for (int64_t id : {with_diff, empty_diff}) {
    Build b = **store->claim(claimer());
    ASSERT_EQ(b.id, id);
    FinishRequest done;
    done.status = BuildStatus::succeeded;
    done.reason = OutcomeReason::no_verify;
    done.result_diff = id == with_diff ? "--- a/x\n+++ b/x\n" : "";
    ASSERT_OK(store->finish(id, b.attempt, done));
  }
  Result<Build> got = store->get(with_diff, /*include_diff=*/false);
  ASSERT_OK(got);
  EXPECT_FALSE(got->result_diff);
  EXPECT_TRUE(got->has_diff);
  EXPECT_FALSE(store->get(empty_diff)->has_diff);
  EXPECT_FALSE(store->get(queued)->has_diff);
  Result<ListPage> page = store->list({});
  ASSERT_OK(page);
  ASSERT_EQ(page->builds.size(), 3u);
  EXPECT_FALSE(page->builds[0].result_diff);  // lists never load diffs
  EXPECT_EQ(page->builds[0].has_diff, false);
  EXPECT_EQ(page->builds[1].has_diff, false);
  EXPECT_EQ(page->builds[2].has_diff, true);
}

TEST(StoreQueue, FinishRefusesAReasonThatDoesNotFitTheStatus) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  FinishRequest bad;
  bad.status = BuildStatus::succeeded;
  bad.reason = OutcomeReason::step_limit;
  Result<Build> f = store->finish(id, b.attempt, bad);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().field, "reason");
  bad.status = BuildStatus::running;
  EXPECT_EQ(store->finish(id, b.attempt, bad).error().field, "status");
  EXPECT_EQ(store->get(id)->status, BuildStatus::running);
}

TEST(StoreQueue, CancelQueuedIsImmediateAndCancelFinishedIsAConflict) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Result<CancelReply> c = store->cancel(id);
  ASSERT_OK(c);
  EXPECT_TRUE(c->immediate);
  EXPECT_EQ(c->build.status, BuildStatus::cancelled);
  EXPECT_EQ(c->build.outcome, OutcomeReason::cancelled);
  EXPECT_TRUE(c->build.finished_ms);
  EXPECT_FALSE(store->claim(claimer())->has_value());
  EXPECT_EQ(store->cancel(id).error().code, ErrorCode::conflict);
  EXPECT_EQ(store->cancel(id + 1).error().code, ErrorCode::not_found);
}

TEST(StoreQueue, RecoveryRequeuesExpiredLeasesThenGivesUpAfterMaxAttempts) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock, /*max_attempts=*/2);
  int64_t id = store->submit(spec())->id;
  for (int attempt = 1; attempt <= 2; ++attempt) {
    Build b = **store->claim(claimer("w", 1000));
    EXPECT_EQ(b.attempt, attempt);
    clock.advance(1001);
    Result<RecoveryReport> r = store->recover();
    ASSERT_OK(r);
    if (attempt == 1) {
      EXPECT_EQ(r->requeued, 1);
      EXPECT_EQ(store->get(id)->status, BuildStatus::queued);
    } else {
      EXPECT_EQ(r->errored, 1);
    }
  }
  Build b = *store->get(id);
  EXPECT_EQ(b.status, BuildStatus::error);
  EXPECT_EQ(b.outcome, OutcomeReason::infra_error);
  EXPECT_TRUE(b.error_message && b.error_message->find("2 attempts") != std::string::npos);
}

TEST(StoreQueue, RecoveryCancelsAnExpiredBuildWhoseCancelWasRequested) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t id = store->submit(spec())->id;
  ASSERT_TRUE(store->claim(claimer("w", 1000))->has_value());
  ASSERT_OK(store->cancel(id));
  clock.advance(2000);
  Result<RecoveryReport> r = store->recover();
  ASSERT_OK(r);
  EXPECT_EQ(r->cancelled, 1);
  EXPECT_EQ(store->get(id)->status, BuildStatus::cancelled);
}

// A worker shutting down hands its attempt back at once: the build is queued again without
// waiting for the lease, and restarts do not use up its attempts (three graceful restarts used
// to end a healthy build with "lease expired on 3 attempts").
TEST(StoreQueue, ReleaseRequeuesAtOnceAndDoesNotCountTowardMaxAttempts) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock, /*max_attempts=*/2);
  int64_t id = store->submit(spec())->id;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Build b = **store->claim(claimer("w", 1000));
    ASSERT_EQ(b.attempt, attempt);
    Result<Build> released = store->release(id, attempt);
    ASSERT_OK(released);
    EXPECT_EQ(released->status, BuildStatus::queued);
    EXPECT_FALSE(released->lease_owner.has_value());
    EXPECT_EQ(store->release(id, attempt).error().code, ErrorCode::fenced);  // no longer running
    EXPECT_NE(store->read_events(id, 0)->back().payload_json.find("\"status\":\"queued\""), std::string::npos);
  }
  // Two lease expiries still end it (max_attempts counts those only).
  Build b = **store->claim(claimer("w", 1000));
  EXPECT_EQ(b.attempt, 4);
  clock.advance(1001);
  ASSERT_EQ(store->recover()->requeued, 1);
  ASSERT_TRUE(store->claim(claimer("w", 1000))->has_value());
  clock.advance(1001);
  ASSERT_EQ(store->recover()->errored, 1);
  EXPECT_NE(store->get(id)->error_message.value_or("").find("2 attempts"), std::string::npos);
}

TEST(StoreQueue, ReleaseOfAnAttemptWhoseCancelWasRequestedCancelsIt) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer("w", 1000));
  ASSERT_OK(store->cancel(id));
  Result<Build> released = store->release(id, b.attempt);
  ASSERT_OK(released);
  EXPECT_EQ(released->status, BuildStatus::cancelled);
  EXPECT_EQ(released->outcome, OutcomeReason::cancelled);
}

TEST(StoreQueue, ClaimWaitWakesOnSubmitFromAnotherThread) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  std::thread submitter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_OK(store->submit(spec()));
  });
  auto start = std::chrono::steady_clock::now();
  Result<std::optional<Build>> c = store->claim_wait(claimer(), milliseconds(10'000));
  submitter.join();
  ASSERT_OK(c);
  EXPECT_TRUE(c->has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
}

TEST(StoreQueue, StopWaitingReleasesABlockedClaimWait) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store->stop_waiting();
  });
  Result<std::optional<Build>> c = store->claim_wait(claimer(), milliseconds(20'000));
  stopper.join();
  ASSERT_OK(c);
  EXPECT_FALSE(c->has_value());
}

TEST(StoreQueue, ListFiltersByStatusAndModelAndPagesByCursor) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  std::vector<int64_t> a_ids;
  for (int i = 0; i < 7; ++i) {
    a_ids.push_back(store->submit(spec("task " + std::to_string(i), "qwen-a"))->id);
    ASSERT_OK(store->submit(spec("t", "qwen-b")));
  }
  ASSERT_OK(store->claim(claimer()));  // takes a_ids[0] (oldest)
  ListQuery q;
  q.model = "qwen-a";
  q.status = BuildStatus::queued;
  q.limit = 4;
  Result<ListPage> p1 = store->list(q);
  ASSERT_OK(p1);
  ASSERT_EQ(p1->builds.size(), 4u);
  EXPECT_EQ(p1->builds[0].id, a_ids[6]);
  EXPECT_EQ(p1->builds[3].id, a_ids[3]);
  ASSERT_TRUE(p1->next_cursor);
  q.cursor = p1->next_cursor;
  Result<ListPage> p2 = store->list(q);
  ASSERT_OK(p2);
  ASSERT_EQ(p2->builds.size(), 2u);
  EXPECT_EQ(p2->builds[1].id, a_ids[1]);
  EXPECT_FALSE(p2->next_cursor);
  q.limit = 0;
  EXPECT_EQ(store->list(q).error().field, "limit");
}

TEST(StoreQueue, StatsCountEveryStatusAndSumTokens) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  for (int i = 0; i < 3; ++i) ASSERT_OK(store->submit(spec()));
  Build b = **store->claim(claimer());
  BuildMetrics d;
  d.tokens_generated = 40;
  d.tokens_prefilled = 100;
  ASSERT_OK(store->add_metrics(b.id, b.attempt, d));
  Result<StoreStats> s = store->stats();
  ASSERT_OK(s);
  EXPECT_EQ(s->builds_by_status.size(), 6u);
  EXPECT_EQ(s->queue_depth, 2);
  EXPECT_EQ(s->builds_by_status.at(BuildStatus::running), 1);
  EXPECT_EQ(s->builds_by_status.at(BuildStatus::succeeded), 0);
  EXPECT_EQ(s->tokens_generated, 40);
  EXPECT_EQ(s->tokens_prefilled, 100);
}

}  // namespace
}  // namespace kiln::store
