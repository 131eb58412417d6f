// A randomized test of the real SQLite queue against a trivially-correct in-memory model of it
// (LevelDB's ModelDB habit): random submits, claims, heartbeats, finishes, cancels, appends,
// clock jumps (lease expiries), recoveries and restarts, comparing the whole state every step.
#include <random>

#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

struct ModelBuild {
  BuildStatus status = BuildStatus::queued;
  int attempt = 0;
  int64_t priority = 0;
  int64_t created_ms = 0;
  std::optional<int64_t> lease_expires_ms;
  bool cancel_requested = false;
  int64_t events = 1;  // the queued status event
};

// The obviously-correct queue: a map and linear scans.
struct QueueModel {
  std::map<int64_t, ModelBuild> builds;
  int max_attempts = 3;

  bool owns(int64_t id, int attempt) const {
    auto it = builds.find(id);
    return it != builds.end() && it->second.status == BuildStatus::running && it->second.attempt == attempt;
  }
  std::optional<int64_t> claim(int64_t now, int64_t lease_ms) {
    std::optional<int64_t> best;
    for (const auto& [id, b] : builds) {
      if (b.status != BuildStatus::queued) continue;
      if (!best) {
        best = id;
        continue;
      }
      const ModelBuild& cur = builds.at(*best);
      if (b.priority > cur.priority || (b.priority == cur.priority && b.created_ms < cur.created_ms))
        best = id;
    }
    if (best) {
      ModelBuild& b = builds.at(*best);
      b.status = BuildStatus::running;
      b.attempt += 1;
      b.lease_expires_ms = now + lease_ms;
      b.events += 1;
    }
    return best;
  }
  void finish(int64_t id, BuildStatus status) {
    ModelBuild& b = builds.at(id);
    b.status = status;
    b.lease_expires_ms.reset();
    b.events += 1;
  }
  void recover(int64_t now) {
    for (auto& [id, b] : builds) {
      if (b.status != BuildStatus::running || *b.lease_expires_ms >= now) continue;
      b.status = b.cancel_requested          ? BuildStatus::cancelled
                 : b.attempt >= max_attempts ? BuildStatus::error
                                             : BuildStatus::queued;
      b.lease_expires_ms.reset();
      b.events += 1;
    }
  }
};

void check_same_state(Store& store, const QueueModel& model, int step) {
  ListQuery all;
  all.limit = 1000;
  Result<ListPage> page = store.list(all);
  ASSERT_OK(page);
  ASSERT_EQ(page->builds.size(), model.builds.size()) << "step " << step;
  for (const Build& b : page->builds) {
    const ModelBuild& m = model.builds.at(b.id);
    ASSERT_EQ(b.status, m.status) << "build " << b.id << " step " << step;
    ASSERT_EQ(b.attempt, m.attempt) << "build " << b.id << " step " << step;
    ASSERT_EQ(b.lease_expires_ms, m.lease_expires_ms) << "build " << b.id << " step " << step;
    ASSERT_EQ(b.cancel_requested, m.cancel_requested) << "build " << b.id << " step " << step;
    ASSERT_EQ(b.finished_ms.has_value(), is_terminal(m.status)) << "build " << b.id;
  }
}

void check_same_events(Store& store, const QueueModel& model) {
  for (const auto& [id, m] : model.builds) {
    Result<std::vector<Event>> events = store.read_events(id, 0, 10000);
    ASSERT_OK(events);
    ASSERT_EQ(static_cast<int64_t>(events->size()), m.events) << "build " << id;
    for (size_t i = 0; i < events->size(); ++i) ASSERT_EQ((*events)[i].seq, static_cast<int64_t>(i + 1));
  }
}

void run_model_test(uint32_t seed, int steps) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  TempDir dir;
  ManualClock clock;
  std::string path = dir.file("kiln.db");
  auto store = open_store(path, &clock);
  QueueModel model;
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  // A random known build (or, now and then, one that does not exist) and an attempt that is
  // usually its current one and sometimes stale or from the future.
  auto target = [&]() -> std::pair<int64_t, int> {
    if (model.builds.empty() || pick(20) == 0) return {999'999, 1};
    auto it = std::next(model.builds.begin(), pick(static_cast<int>(model.builds.size())));
    int attempt = it->second.attempt + (pick(4) == 0 ? (pick(2) ? 1 : -1) : 0);
    return {it->first, attempt};
  };

  for (int step = 0; step < steps; ++step) {
    int op = pick(100);
    if (op < 22) {  // submit
      BuildSpec s = spec("task " + std::to_string(step));
      s.priority = pick(3);
      Result<Build> b = store->submit(s);
      ASSERT_OK(b);
      model.builds[b->id] = ModelBuild{BuildStatus::queued, 0, s.priority, clock.now(), {}, false, 1};
    } else if (op < 42) {  // claim
      int64_t lease = 1000 + pick(4000);
      Result<std::optional<Build>> got = store->claim(claimer("w", lease));
      ASSERT_OK(got);
      std::optional<int64_t> expected = model.claim(clock.now(), lease);
      ASSERT_EQ(got->has_value(), expected.has_value()) << "step " << step;
      if (expected) {
        ASSERT_EQ((*got)->id, *expected) << "step " << step;
      }
    } else if (op < 52) {  // heartbeat
      auto [id, attempt] = target();
      int64_t lease = 1000 + pick(4000);
      Result<HeartbeatReply> hb = store->heartbeat(id, attempt, lease);
      ASSERT_EQ(hb.ok(), model.owns(id, attempt)) << "step " << step;
      if (hb.ok()) {
        ModelBuild& m = model.builds.at(id);
        m.lease_expires_ms = clock.now() + lease;
        ASSERT_EQ(hb->cancel_requested, m.cancel_requested);
      } else {
        ASSERT_EQ(hb.error().code, model.builds.count(id) ? ErrorCode::fenced : ErrorCode::not_found);
      }
    } else if (op < 62) {  // finish
      auto [id, attempt] = target();
      static const std::pair<BuildStatus, OutcomeReason> kEnds[] = {
          {BuildStatus::succeeded, OutcomeReason::verified},
          {BuildStatus::failed, OutcomeReason::step_limit},
          {BuildStatus::cancelled, OutcomeReason::cancelled},
          {BuildStatus::error, OutcomeReason::model_error}};
      auto [status, reason] = kEnds[pick(4)];
      FinishRequest f;
      f.status = status;
      f.reason = reason;
      bool expected = model.owns(id, attempt);
      Result<Build> r = store->finish(id, attempt, f);
      ASSERT_EQ(r.ok(), expected) << "step " << step;
      if (expected) model.finish(id, status);
    } else if (op < 70) {  // cancel
      auto [id, attempt] = target();
      Result<CancelReply> r = store->cancel(id);
      auto it = model.builds.find(id);
      if (it == model.builds.end()) {
        ASSERT_EQ(r.error().code, ErrorCode::not_found);
      } else if (is_terminal(it->second.status)) {
        ASSERT_EQ(r.error().code, ErrorCode::conflict);
      } else {
        ASSERT_OK(r);
        ModelBuild& m = it->second;
        ASSERT_EQ(r->immediate, m.status == BuildStatus::queued);
        if (m.status == BuildStatus::queued) {
          m.status = BuildStatus::cancelled;
          m.events += 1;
        } else if (!m.cancel_requested) {
          m.cancel_requested = true;
          m.events += 1;
        }
      }
    } else if (op < 82) {  // append an event
      auto [id, attempt] = target();
      Result<int64_t> seq = store->append_event(id, attempt, event_kind::log, R"({"step":1})");
      ASSERT_EQ(seq.ok(), model.owns(id, attempt)) << "step " << step;
      if (seq.ok()) {
        ModelBuild& m = model.builds.at(id);
        m.events += 1;
        ASSERT_EQ(*seq, m.events);
      }
    } else if (op < 92) {  // time passes; leases may expire
      clock.advance(pick(3000));
    } else if (op < 97) {  // the periodic recovery pass
      ASSERT_OK(store->recover());
      model.recover(clock.now());
    } else {  // restart: close and reopen, which recovers
      store.reset();
      store = open_store(path, &clock);
      ASSERT_TRUE(store);
      model.recover(clock.now());
    }
    check_same_state(*store, model, step);
    if (step % 50 == 49) check_same_events(*store, model);
  }
  check_same_events(*store, model);
}

TEST(StoreModel, RandomOperationsMatchTheInMemoryModel) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    run_model_test(seed, 400);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kiln::store
