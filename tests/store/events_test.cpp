// The event log (store/events.cpp): gapless seqs, status events, reads after a seq, waits.
#include <thread>

#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;
using std::chrono::milliseconds;

TEST(StoreEvents, TransitionsAndAppendsShareOneGaplessSequence) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  Result<int64_t> seq = store->append_event(id, b.attempt, event_kind::log, R"({"line":"cloning"})");
  ASSERT_OK(seq);
  EXPECT_EQ(*seq, 3);  // 1 queued, 2 running, 3 this
  Result<int64_t> last = store->append_events(
      id, b.attempt, {{"model_text", R"({"text":"hi"})"}, {"tool_call", R"({"name":"shell"})"}});
  ASSERT_OK(last);
  EXPECT_EQ(*last, 5);
  FinishRequest done;
  done.reason = OutcomeReason::no_verify;
  ASSERT_OK(store->finish(id, b.attempt, done));

  Result<std::vector<Event>> events = store->read_events(id, 0);
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 6u);
  std::vector<std::string> kinds;
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].seq, static_cast<int64_t>(i + 1));
    kinds.push_back((*events)[i].kind);
  }
  EXPECT_EQ(kinds,
            (std::vector<std::string>{"status", "status", "log", "model_text", "tool_call", "status"}));
  EXPECT_NE((*events)[0].payload_json.find("\"queued\""), std::string::npos);
  EXPECT_NE((*events)[5].payload_json.find("\"succeeded\""), std::string::npos);
  EXPECT_EQ((*events)[2].attempt, 1);

  Result<std::vector<Event>> tail = store->read_events(id, 4, 1);
  ASSERT_OK(tail);
  ASSERT_EQ(tail->size(), 1u);
  EXPECT_EQ((*tail)[0].seq, 5);
  EXPECT_EQ(store->read_events(id + 1, 0).error().code, ErrorCode::not_found);
}

TEST(StoreEvents, AppendRefusesInvalidJsonAndEmptyKindAndWritesNothing) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  Result<int64_t> bad = store->append_event(id, b.attempt, "log", "{not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().field, "payload");
  EXPECT_EQ(store->append_event(id, b.attempt, "", "{}").error().field, "kind");
  // All or none: one bad payload in a batch keeps the good ones out too.
  EXPECT_FALSE(store->append_events(id, b.attempt, {{"log", "{}"}, {"log", "[1,"}}).ok());
  EXPECT_EQ(store->read_events(id, 0)->size(), 2u);
}

TEST(StoreEvents, AppendToAQueuedBuildIsFenced) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  EXPECT_EQ(store->append_event(id, 0, "log", "{}").error().code, ErrorCode::fenced);
  EXPECT_EQ(store->append_event(id + 5, 1, "log", "{}").error().code, ErrorCode::not_found);
}

TEST(StoreEvents, WaitForEventsWakesOnAppend) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_OK(store->append_event(id, b.attempt, "log", R"({"line":"late"})"));
  });
  auto start = std::chrono::steady_clock::now();
  Result<std::vector<Event>> got = store->wait_for_events(id, 2, 100, milliseconds(10'000));
  writer.join();
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].seq, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
}

TEST(StoreEvents, WaitForEventsReturnsEmptyAtTimeout) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  auto start = std::chrono::steady_clock::now();
  Result<std::vector<Event>> got = store->wait_for_events(id, 1, 100, milliseconds(30));
  ASSERT_OK(got);
  EXPECT_TRUE(got->empty());
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(30));
}

TEST(StoreEvents, AddMetricsAccumulatesAndMergesToolCounts) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  BuildMetrics d;
  d.tokens_generated = 10;
  d.steps = 1;
  d.seconds_decode = 0.5;
  d.tool_calls = {{"shell", 1}};
  ASSERT_OK(store->add_metrics(id, b.attempt, d));
  d.tool_calls = {{"shell", 2}, {"git", 1}};
  ASSERT_OK(store->add_metrics(id, b.attempt, d));
  BuildMetrics m = store->get(id)->metrics;
  EXPECT_EQ(m.tokens_generated, 20);
  EXPECT_EQ(m.steps, 2);
  EXPECT_DOUBLE_EQ(m.seconds_decode, 1.0);
  EXPECT_EQ(m.tool_calls.at("shell"), 3);
  EXPECT_EQ(m.tool_calls.at("git"), 1);
  d.tokens_generated = -1;
  EXPECT_EQ(store->add_metrics(id, b.attempt, d).error().field, "metrics");
  EXPECT_EQ(store->add_metrics(id, b.attempt + 1, BuildMetrics{}).error().code, ErrorCode::fenced);
}


// Metrics with the event that explains them: both land, or (fenced, bad event) neither.
TEST(StoreEvents, AddMetricsWithAnEventWritesBothOrNeither) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  int64_t id = store->submit(spec())->id;
  Build b = **store->claim(claimer());
  const size_t before = store->read_events(id, 0)->size();
  BuildMetrics d;
  d.steps = 3;
  NewEvent note{"log", R"({"recovered_attempt": 1})"};
  ASSERT_OK(store->add_metrics(id, b.attempt, d, &note));
  EXPECT_EQ(store->get(id)->metrics.steps, 3);
  auto events = store->read_events(id, 0);
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), before + 1);
  EXPECT_EQ(events->back().kind, "log");
  EXPECT_EQ(events->back().payload_json, R"({"recovered_attempt": 1})");

  NewEvent bad{"log", "{not json"};
  EXPECT_EQ(store->add_metrics(id, b.attempt, d, &bad).error().field, "payload");
  EXPECT_EQ(store->add_metrics(id, b.attempt + 1, d, &note).error().code, ErrorCode::fenced);
  EXPECT_EQ(store->get(id)->metrics.steps, 3);
  EXPECT_EQ(store->read_events(id, 0)->size(), before + 1);
}

}  // namespace
}  // namespace kiln::store
