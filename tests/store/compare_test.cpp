// Comparisons across models (store/compare.cpp): the exact McNemar test and the summaries.
#include <cmath>

#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

TEST(StoreCompare, McNemarExactMatchesHandComputedBinomialValues) {
  // p = min(1, 2 * sum_{i<=min(b,c)} C(b+c, i) / 2^(b+c)).
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(4, 3), 1.0);      // 2 * 64/128 = 1
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 6), 0.03125);  // 2 * 1/64
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(6, 0), 0.03125);
  EXPECT_NEAR(mcnemar_exact_p(1, 9), 2.0 * 11 / 1024, 1e-12);   // 0.021484375
  EXPECT_NEAR(mcnemar_exact_p(2, 10), 2.0 * 79 / 4096, 1e-12);  // 0.03857421875
  EXPECT_NEAR(mcnemar_exact_p(5, 5), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 0), 1.0);
  // Large n stays finite and tiny rather than underflowing to garbage.
  double p = mcnemar_exact_p(0, 2000);
  EXPECT_GE(p, 0.0);
  EXPECT_LT(p, 1e-300);
  // Python: 2 * sum(comb(1000, i) for i in range(481)) / 2**1000, exact integers.
  EXPECT_NEAR(mcnemar_exact_p(480, 520), 0.21744829320414094, 1e-9);
}

// Runs one build of `task` on `model` for `ms` of the clock and finishes it with `f`.
void finish_build(Store& store, ManualClock& clock, const std::string& task, const std::string& model, int64_t ms,
                  const FinishRequest& f) {
  int64_t id = store.submit(spec(task, model))->id;
  ClaimRequest c = claimer();
  c.models = {model};
  Build b = **store.claim(c);
  ASSERT_EQ(b.id, id);
  clock.advance(ms);
  ASSERT_OK(store.finish(id, b.attempt, f));
}

// Runs one build of `task` on `model` to the end with the given outcome and times.
void run_build(Store& store, ManualClock& clock, const std::string& task, const std::string& model,
               bool success, double wall_s, int64_t tokens, double decode_s) {
  FinishRequest f;
  f.status = success ? BuildStatus::succeeded : BuildStatus::failed;
  f.reason = success ? OutcomeReason::verified : OutcomeReason::verify_failed;
  BuildMetrics m;
  m.tokens_generated = tokens;
  m.seconds_decode = decode_s;
  m.seconds_wall = wall_s;
  f.metrics = m;
  finish_build(store, clock, task, model, static_cast<int64_t>(wall_s * 1000), f);
}

TEST(StoreCompare, PerModelStatsAndPairedCountsOverTheSameTasks) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  // Tasks t0..t3 on both models; t4 only on A. A: wins t0 t1, loses t2 t3; B: wins t0 t2.
  run_build(*store, clock, "t0", "a", true, 10, 100, 2);
  run_build(*store, clock, "t1", "a", true, 20, 200, 2);
  run_build(*store, clock, "t2", "a", false, 30, 300, 2);
  run_build(*store, clock, "t3", "a", false, 40, 400, 2);
  run_build(*store, clock, "t4", "a", true, 50, 500, 2);
  run_build(*store, clock, "t0", "b", true, 5, 10, 1);
  run_build(*store, clock, "t1", "b", false, 10, 10, 1);
  run_build(*store, clock, "t2", "b", true, 60, 10, 1);
  run_build(*store, clock, "t3", "b", false, 20, 10, 1);
  // A cancelled build is no evidence and must not count.
  int64_t cancelled = store->submit(spec("t0", "b"))->id;
  ASSERT_OK(store->cancel(cancelled));

  Result<CompareReport> r = store->compare(CompareQuery{});
  ASSERT_OK(r);
  ASSERT_EQ(r->models.size(), 2u);
  const ModelStats& a = r->models[0];
  EXPECT_EQ(a.model, "a");
  EXPECT_EQ(a.builds, 5);
  EXPECT_EQ(a.succeeded, 3);
  EXPECT_DOUBLE_EQ(a.success_rate.value(), 0.6);
  // Times are of succeeded builds (10, 20, 50): a model that gives up early must not look fast.
  EXPECT_DOUBLE_EQ(a.median_wall_s.value(), 20);
  EXPECT_DOUBLE_EQ(a.p90_wall_s.value(), 50);  // nearest rank: ceil(0.9*3) = 3rd
  EXPECT_DOUBLE_EQ(a.median_tokens_generated.value(), 300);  // tokens: of every build
  EXPECT_DOUBLE_EQ(a.decode_tokens_per_s.value(), 1500.0 / 10.0);
  const ModelStats& b = r->models[1];
  EXPECT_EQ(b.builds, 4);
  EXPECT_DOUBLE_EQ(b.median_wall_s.value(), 32.5);  // (5 + 60) / 2: its two successes

  ASSERT_EQ(r->pairs.size(), 1u);
  const PairStats& p = r->pairs[0];
  EXPECT_EQ(p.tasks, 4);
  EXPECT_EQ(p.both_succeeded, 1);
  EXPECT_EQ(p.only_a, 1);
  EXPECT_EQ(p.only_b, 1);
  EXPECT_EQ(p.both_failed, 1);
  EXPECT_DOUBLE_EQ(p.mcnemar_p, 1.0);
  ASSERT_TRUE(p.median_wall_ratio);
  // Only where both succeeded (t0): 10/5 = 2.
  EXPECT_DOUBLE_EQ(*p.median_wall_ratio, 2.0);
  EXPECT_NE(to_json(*r).find("\"mcnemar_p\":1.0"), std::string::npos) << to_json(*r);
}

TEST(StoreCompare, PairsUseTheLatestRunOfEachTask) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  run_build(*store, clock, "t", "a", false, 10, 1, 1);
  run_build(*store, clock, "t", "a", true, 10, 1, 1);  // the rerun succeeded
  run_build(*store, clock, "t", "b", false, 10, 1, 1);
  CompareQuery q;
  q.models = {"b", "a"};
  Result<CompareReport> r = store->compare(q);
  ASSERT_OK(r);
  EXPECT_EQ(r->models[0].builds, 2);
  ASSERT_EQ(r->pairs.size(), 1u);
  EXPECT_EQ(r->pairs[0].model_a, "a");
  EXPECT_EQ(r->pairs[0].tasks, 1);
  EXPECT_EQ(r->pairs[0].only_a, 1);
}

TEST(StoreCompare, SinceKeepsOnlyBuildsFinishedAtOrAfterIt) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  run_build(*store, clock, "t0", "a", false, 10, 100, 1);  // finishes at start + 10 s
  run_build(*store, clock, "t0", "b", false, 10, 100, 1);  // + 20 s
  int64_t cutoff = clock.now();                            // the moment b's first build finished
  run_build(*store, clock, "t0", "a", true, 20, 300, 1);   // + 40 s
  run_build(*store, clock, "t1", "a", true, 30, 500, 1);   // + 70 s

  CompareQuery q;
  q.models = {"a", "b"};
  q.since_ms = cutoff;
  Result<CompareReport> r = store->compare(q);
  ASSERT_OK(r);
  ASSERT_EQ(r->models.size(), 2u);
  EXPECT_EQ(r->models[0].builds, 2);  // a's first (failed) build is before the cutoff
  EXPECT_EQ(r->models[0].succeeded, 2);
  EXPECT_DOUBLE_EQ(r->models[0].median_wall_s.value(), 25);
  EXPECT_EQ(r->models[1].builds, 1);  // finished exactly at the cutoff: kept
  ASSERT_EQ(r->pairs.size(), 1u);
  EXPECT_EQ(r->pairs[0].tasks, 1);
  EXPECT_EQ(r->pairs[0].only_a, 1);

  q.since_ms = clock.now() + 1;  // nothing finished after now
  r = store->compare(q);
  ASSERT_OK(r);
  EXPECT_EQ(r->models[0].builds, 0);
  EXPECT_EQ(r->models[1].builds, 0);
  EXPECT_EQ(r->pairs[0].tasks, 0);
  // Nothing to compute from: no number rather than a made-up 0 % and 0.0 s.
  EXPECT_FALSE(r->models[0].success_rate || r->models[0].median_wall_s || r->models[0].p90_wall_s ||
               r->models[0].median_tokens_generated || r->models[0].decode_tokens_per_s);
  EXPECT_NE(to_json(*r).find("\"success_rate\":null"), std::string::npos) << to_json(*r);
  EXPECT_FALSE(r->pairs[0].median_wall_ratio);

  q.since_ms.reset();  // all time
  r = store->compare(q);
  ASSERT_OK(r);
  EXPECT_EQ(r->models[0].builds, 3);
}

// kiln's own failures (a clone, the sandbox, a lost lease) say nothing about the model: they are
// left out of its builds, success rate and times, and of the pairs.
TEST(StoreCompare, KilnsOwnFailuresDoNotCountAgainstAModel) {
  TempDir dir;
  ManualClock clock;
  auto store = open_store(dir.file("kiln.db"), &clock);
  run_build(*store, clock, "t", "a", true, 10, 1, 1);
  run_build(*store, clock, "t", "b", true, 20, 1, 1);
  FinishRequest f;  // then a's rerun of t fails to clone
  f.status = BuildStatus::error;
  f.reason = OutcomeReason::infra_error;
  f.error_message = "clone failed";
  finish_build(*store, clock, "t", "a", 100, f);

  CompareQuery q;
  q.models = {"a", "b"};
  Result<CompareReport> r = store->compare(q);
  ASSERT_OK(r);
  EXPECT_EQ(r->models[0].builds, 1);
  EXPECT_DOUBLE_EQ(r->models[0].success_rate.value(), 1.0);
  ASSERT_EQ(r->pairs.size(), 1u);
  EXPECT_EQ(r->pairs[0].both_succeeded, 1);  // the latest informative build of t, not the clone failure
  EXPECT_DOUBLE_EQ(r->pairs[0].median_wall_ratio.value(), 0.5);
}

}  // namespace
}  // namespace kiln::store
