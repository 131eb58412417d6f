// Fault injection (SQLite's faultsim / Beast's fail_count habit): the n-th SQLite step fails
// with BUSY or IOERR, for n = 0, 1, 2, ... until a whole scenario runs without reaching n.
// Every operation must then either give the right result or a clean, named error after which
// retrying gives the right result, and the final state must be exactly the fault-free one: no
// lost writes, no doubled events or metrics, no half-finished transitions.
#include <sqlite3.h>

#include "store/sqlite_db.h"
#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

// Fails exactly one step: the n-th one counted from arming.
struct OneFault {
  int fail_at;
  int code;
  int seen = 0;
  bool fired = false;
  int operator()() {
    if (seen++ == fail_at) {
      fired = true;
      return code;
    }
    return SQLITE_OK;
  }
};

class FaultHookGuard {
 public:
  explicit FaultHookGuard(std::shared_ptr<OneFault> fault) {
    detail::set_step_fault_hook([fault] { return (*fault)(); });
  }
  ~FaultHookGuard() { detail::set_step_fault_hook({}); }
};

// Calls op until it succeeds; a failure must be a named busy/io error (at most one per op, as
// only one fault is armed). Returns the successful result.
template <class F>
auto until_ok(F op, int& failures, const char* what) -> decltype(op()) {
  while (true) {
    auto r = op();
    if (r.ok()) return r;
    ++failures;
    EXPECT_TRUE(r.error().code == ErrorCode::io || r.error().code == ErrorCode::busy)
        << what << ": " << r.error().message;
    EXPECT_NE(r.error().message.find("kiln.db"), std::string::npos)
        << what << " error does not name the file: " << r.error().message;
    if (failures > 5) return r;
  }
}

// One build's whole life; returns true if the fault fired somewhere.
bool run_scenario(int fail_at, int code) {
  SCOPED_TRACE("fault at step " + std::to_string(fail_at) + " code " + std::to_string(code));
  TempDir dir;
  ManualClock clock;
  StoreOptions options;
  options.path = dir.file("kiln.db");
  options.now_ms = clock.fn();
  auto fault = std::make_shared<OneFault>(OneFault{fail_at, code});
  int failures = 0;
  {
    FaultHookGuard guard(fault);
    auto store = until_ok([&] { return Store::open(options); }, failures, "open");
    if (!store.ok()) return true;
    Store& s = **store;
    auto b = until_ok([&] { return s.submit(spec()); }, failures, "submit");
    auto c = until_ok([&] { return s.claim(claimer()); }, failures, "claim");
    if (!b.ok() || !c.ok() || !c->has_value()) {
      ADD_FAILURE() << "scenario could not claim";
      return true;
    }
    int64_t id = (*c)->id;
    int attempt = (*c)->attempt;
    EXPECT_EQ(attempt, 1);
    for (int i = 0; i < 2; ++i) {
      (void)until_ok([&] { return s.append_event(id, attempt, "log", R"({"i":1})"); }, failures, "append");
    }
    BuildMetrics d;
    d.tokens_generated = 7;
    d.tool_calls = {{"shell", 1}};
    (void)until_ok([&] { return s.add_metrics(id, attempt, d); }, failures, "add_metrics");
    (void)until_ok([&] { return s.heartbeat(id, attempt, 60'000); }, failures, "heartbeat");
    (void)until_ok([&] { return s.read_events(id, 0); }, failures, "read_events");
    FinishRequest f;
    f.reason = OutcomeReason::verified;
    (void)until_ok([&] { return s.finish(id, attempt, f); }, failures, "finish");
  }
  // Checked without faults, through a fresh Store.
  auto store = open_store(options.path, &clock);
  ListQuery all;
  Result<ListPage> page = store->list(all);
  EXPECT_TRUE(page.ok());
  if (page.ok() && page->builds.size() == 1) {
    const Build& b = page->builds[0];
    EXPECT_EQ(b.status, BuildStatus::succeeded);
    EXPECT_EQ(b.attempt, 1);
    EXPECT_EQ(b.metrics.tokens_generated, 7);
    EXPECT_EQ(b.metrics.tool_calls.at("shell"), 1);
    Result<std::vector<Event>> events = store->read_events(b.id, 0);
    EXPECT_TRUE(events.ok());
    std::vector<std::string> kinds;
    for (const Event& e : *events) kinds.push_back(e.kind);
    EXPECT_EQ(kinds, (std::vector<std::string>{"status", "status", "log", "log", "status"}));
  } else {
    ADD_FAILURE() << "expected exactly one build";
  }
  if (code == SQLITE_BUSY) {
    EXPECT_EQ(failures, 0) << "a single BUSY must be retried inside the store";
  }
  return fault->fired;
}

TEST(StoreFault, EveryStepFailingWithIoerrGivesACleanErrorAndNoPartialWrite) {
  int n = 0;
  while (run_scenario(n, SQLITE_IOERR_WRITE) && !HasFailure()) ++n;
  EXPECT_GT(n, 20);  // the scenario really makes that many steps
}

TEST(StoreFault, EveryStepFailingWithBusyIsRetriedTransparently) {
  int n = 0;
  while (run_scenario(n, SQLITE_BUSY) && !HasFailure()) ++n;
  EXPECT_GT(n, 20);
}

}  // namespace
}  // namespace kiln::store
