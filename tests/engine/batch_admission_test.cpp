// Admission and memory: sessions beyond max_sessions wait in line by priority (then arrival) and
// see their position; a non-blocking open never jumps the line; when KV pages run out the new
// call is refused with "context memory exhausted" and running sessions go on unharmed; the
// scheduler serves prefill by priority.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "test_models.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::random_tokens;

using testing::make_model;
using namespace std::chrono_literals;


void wait_for(const std::function<bool()>& pred) {
  for (int i = 0; i < 2000 && !pred(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(pred());
}

TEST(Admission, WaitersAreAdmittedByPriorityThenArrival) {
  EngineOptions o;
  o.max_sessions = 1;
  auto model = Model::load(make_model(TinyModelOptions{}), o);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  auto holder = m.open_session();
  ASSERT_TRUE(holder.ok());
  EXPECT_FALSE(m.open_session().ok());  // full

  std::mutex mu;
  std::vector<int> admitted;                 // priorities, in admission order
  std::vector<std::vector<int64_t>> positions(4);
  const int priorities[4] = {0, 5, 1, 5};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      OpenOptions w;
      w.priority = priorities[i];
      w.on_wait = [&, i](int64_t p) {
        std::lock_guard<std::mutex> lock(mu);
        positions[size_t(i)].push_back(p);
      };
      auto s = m.open_session_waiting(w);
      ASSERT_TRUE(s.ok()) << s.error();
      std::lock_guard<std::mutex> lock(mu);
      admitted.push_back(i);
    });  // the session closes here, admitting the next
    wait_for([&] { return m.waiting_sessions() == i + 1; });
    wait_for([&] {
      std::lock_guard<std::mutex> lock(mu);
      return !positions[size_t(i)].empty();
    });
  }
  // While others wait, a non-blocking open is refused even by priority.
  auto jumper = m.open_session(100);
  ASSERT_FALSE(jumper.ok());
  EXPECT_NE(jumper.error().find("waiting"), std::string::npos) << jumper.error();
  holder->reset();
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted, (std::vector<int>{1, 3, 2, 0}));
  // Arrival positions: 0 alone (1); the first 5 jumps ahead (1) and pushes 0 to 2; 1 lands
  // between (2); the second 5 behind the first (2).
  EXPECT_EQ(positions[0].front(), 1);
  EXPECT_EQ(positions[1].front(), 1);
  EXPECT_EQ(positions[2].front(), 2);
  EXPECT_EQ(positions[3].front(), 2);
  EXPECT_NE(std::find(positions[0].begin(), positions[0].end(), 4), positions[0].end());  // pushed back to 4
  EXPECT_EQ(m.open_sessions(), 0);
}

TEST(Admission, CancelLeavesTheLine) {
  EngineOptions o;
  o.max_sessions = 1;
  auto model = Model::load(make_model(TinyModelOptions{}), o);
  ASSERT_TRUE(model.ok());
  auto holder = (*model)->open_session();
  std::atomic<bool> cancel{false};
  std::thread t([&] {
    OpenOptions w;
    w.cancel = &cancel;
    auto s = (*model)->open_session_waiting(w);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().find("cancelled"), std::string::npos) << s.error();
  });
  wait_for([&] { return (*model)->waiting_sessions() == 1; });
  cancel = true;
  t.join();
  EXPECT_EQ((*model)->waiting_sessions(), 0);
  holder->reset();
  EXPECT_TRUE((*model)->open_session().ok());
}

TEST(Memory, ExhaustedKvRefusesTheNewcomerAndRunningSessionsGoOn) {
  const std::string dir = make_model(TinyModelOptions{});
  EngineOptions probe;
  probe.max_sessions = 2;
  auto p = Model::load(dir, probe);
  ASSERT_TRUE(p.ok());
  const CapacityPlan plan = (*p)->plan();
  EngineOptions tight = probe;  // room for 8 pages of 16 tokens after the fixed state
  tight.kv_budget_bytes = 2 * plan.state_bytes_per_session + 8 * plan.page_bytes;
  auto model = Model::load(dir, tight);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  ASSERT_EQ(m.plan().pages, 8);
  const int64_t V = m.config().vocab_size;
  const auto prompt = random_tokens(90, V, 3);

  auto runner = m.open_session();
  ASSERT_TRUE((*runner)->append(prompt).ok());  // 6 pages
  GenerateOptions g;
  g.max_tokens = 20;  // 110 tokens: 7 pages, reserved before the first step
  std::atomic<bool> refused{false};
  std::string error;
  auto r = (*runner)->generate(g, [&](int32_t) {
    if (refused) return true;
    auto newcomer = m.open_session();  // another thread in real use; here between two steps
    EXPECT_TRUE(newcomer.ok());
    auto a = (*newcomer)->append(random_tokens(40, V, 4));  // 3 pages: only 1 is free
    EXPECT_FALSE(a.ok());
    if (!a.ok()) error = a.error();
    EXPECT_EQ((*newcomer)->size(), 0);  // untouched
    refused = true;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_NE(error.find("context memory exhausted"), std::string::npos) << error;
  EXPECT_EQ(r->tokens.size(), 20u);

  // The runner's tokens equal a run on a model with plenty of memory.
  auto roomy = Model::load(dir, probe);
  auto ref = (*roomy)->open_session();
  ASSERT_TRUE((*ref)->append(prompt).ok());
  auto rr = (*ref)->generate(g);
  ASSERT_TRUE(rr.ok());
  EXPECT_EQ(r->tokens, rr->tokens);
  EXPECT_EQ(m.kv_pool().pages_in_use(), 7);  // 110 tokens; the unused reservation was given back
}

TEST(Scheduler, PrefillIsServedByPriority) {
  EngineOptions o;
  o.prefill_chunk = 32;
  o.max_sessions = 3;
  auto model = Model::load(make_model(TinyModelOptions{}), o);
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  const int64_t V = m.config().vocab_size;
  auto low = m.open_session(0), high = m.open_session(9), blocker = m.open_session();
  // A long prefill occupies the scheduler while both others queue theirs.
  std::thread tb([&] { ASSERT_TRUE((*blocker)->append(random_tokens(1500, V, 1)).ok()); });
  wait_for([&] { return !m.scheduler().step_log().empty(); });
  std::atomic<int> order{0};
  int low_done = 0, high_done = 0;
  std::thread tl([&] { ASSERT_TRUE((*low)->append(random_tokens(200, V, 2)).ok()); low_done = ++order; });
  std::this_thread::sleep_for(5ms);  // low is queued behind the blocker (same priority, later)
  std::thread th([&] { ASSERT_TRUE((*high)->append(random_tokens(200, V, 3)).ok()); high_done = ++order; });
  tb.join(), tl.join(), th.join();
  EXPECT_LT(high_done, low_done) << "the priority-9 prefill, queued later, should finish first";
  for (const StepRecord& r : m.scheduler().step_log()) EXPECT_LE(r.prefill_rows, 32);
}

}  // namespace
}  // namespace kiln::engine
