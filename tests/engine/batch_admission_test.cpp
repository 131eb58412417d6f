// Admission and memory: sessions beyond max_sessions wait in line by priority (then arrival) and
// see their position; a non-blocking open never jumps the line; when KV pages run out a new
// session is refused with "context memory exhausted" and running sessions go on unharmed: they
// are delayed or preempted (re-prefilled later, same tokens), never failed; higher priority
// takes memory from lower; the scheduler serves prefill by priority.
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
  EXPECT_EQ(m.kv_refusals(), 1);
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

// A model for two sessions whose KV pool holds exactly `pages` pages of 16 tokens.
std::unique_ptr<Model> model_with_pages(const std::string& dir, int64_t pages) {
  EngineOptions o;
  o.max_sessions = 2;
  auto probe = Model::load(dir, o);
  EXPECT_TRUE(probe.ok());
  o.kv_budget_bytes = 2 * (*probe)->plan().state_bytes_per_session + pages * (*probe)->plan().page_bytes;
  auto m = Model::load(dir, o);
  EXPECT_TRUE(m.ok()) << m.error();
  EXPECT_EQ((*m)->plan().pages, pages);
  return std::move(m).value();
}

// What a session would generate after `prompt` on a model with plenty of memory.
std::vector<int32_t> reference_generation(const std::string& dir, const std::vector<int32_t>& prompt,
                                          const GenerateOptions& g) {
  auto roomy = Model::load(dir, EngineOptions{});
  auto s = (*roomy)->open_session();
  EXPECT_TRUE((*s)->append(prompt).ok());
  auto r = (*s)->generate(g);
  EXPECT_TRUE(r.ok());
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

// A history recomputed after its pages were taken is recomputed bit for bit: the restore replays
// the steps that made it (the prompt as the chunks it was prefilled in, generated tokens in the
// decode form), so a reclaimed session's next logits equal those of one that kept its pages.
TEST(Memory, ARestoredHistoryIsBitwiseTheHistoryItReplaces) {
  const std::string dir = make_model(TinyModelOptions{});
  EngineOptions small_chunks;
  small_chunks.prefill_chunk = 24;  // the 40-token prompt ran as chunks of 24 + 16
  const int64_t V = 512;
  const auto prompt = random_tokens(40, V, 71), later = random_tokens(3, V, 72), other = random_tokens(100, V, 73);
  GenerateOptions g;
  g.max_tokens = 40;
  auto roomy = Model::load(dir, small_chunks);
  ASSERT_TRUE(roomy.ok());
  auto ref = (*roomy)->open_session();
  ASSERT_TRUE((*ref)->append(prompt).ok());
  ASSERT_TRUE((*ref)->generate(g).ok());
  auto want = (*ref)->append(later);
  ASSERT_TRUE(want.ok());

  EngineOptions o = small_chunks;
  o.max_sessions = 2;
  o.kv_budget_bytes = 2 * (*roomy)->plan().state_bytes_per_session + 8 * (*roomy)->plan().page_bytes;
  auto tight = Model::load(dir, o);
  ASSERT_TRUE(tight.ok());
  Model& m = **tight;
  ASSERT_EQ(m.plan().pages, 8);
  auto a = m.open_session(), b = m.open_session();
  ASSERT_TRUE((*a)->append(prompt).ok());
  ASSERT_TRUE((*a)->generate(g).ok());  // 80 tokens: 5 pages, then idle
  ASSERT_TRUE((*b)->append(other).ok());  // 7 pages: takes a's
  EXPECT_EQ(m.kv_reclaims(), 1);
  (*b).reset();  // its pages back for a's restore
  auto got = (*a)->append(later);
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_EQ((*a)->rebuilt_tokens(), 80);
  EXPECT_TRUE(*got == *want) << "rel L2 " << testing::rel_l2(*got, *want);
}

// Two sessions generate at once and outgrow a full pool: the older one takes the newer one's
// pages; the newer waits, re-prefills its history when the older's call ends, and finishes with
// exactly the tokens it would have produced with memory to spare. Neither call fails.
TEST(Memory, GrowingRunningSessionsPreemptTheNewerInsteadOfFailing) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_pages(dir, 8);
  const int64_t V = m->config().vocab_size;
  const auto prompt_a = random_tokens(50, V, 41), prompt_b = random_tokens(50, V, 42);
  auto a = m->open_session(), b = m->open_session();
  ASSERT_TRUE((*a)->append(prompt_a).ok());  // 4 pages
  ASSERT_TRUE((*b)->append(prompt_b).ok());  // 4 pages: the pool is full
  GenerateOptions g;
  g.max_tokens = 30;  // 80 tokens each: 5 pages each, 10 in all
  std::atomic<bool> b_queued{false};
  Result<GenerateResult> ra = make_error("not run"), rb = make_error("not run");
  std::thread tb([&] {
    rb = (*b)->generate(g, [&](int32_t) {
      b_queued = true;
      return true;
    });
  });
  ra = (*a)->generate(g, [&](int32_t) {
    while (!b_queued) std::this_thread::sleep_for(1ms);  // both inside a call before any page runs out
    return true;
  });
  tb.join();
  ASSERT_TRUE(ra.ok()) << ra.error();
  ASSERT_TRUE(rb.ok()) << rb.error();
  EXPECT_EQ(ra->tokens, reference_generation(dir, prompt_a, g));
  EXPECT_EQ(rb->tokens, reference_generation(dir, prompt_b, g));
  EXPECT_EQ(m->kv_preemptions(), 1);
  EXPECT_EQ((*a)->rebuilt_tokens(), 0);
  EXPECT_GT((*b)->rebuilt_tokens(), 50);  // its prompt and what it had generated when a needed its 5th page
  EXPECT_EQ((*b)->size(), 80);
  // a went idle and gave its pages to b's restore; its next call rebuilds and matches a fresh run.
  EXPECT_EQ(m->kv_reclaims(), 1);
  const auto more = random_tokens(5, V, 43);
  auto after = (*a)->append(more);
  ASSERT_TRUE(after.ok()) << after.error();
  auto roomy = Model::load(dir, EngineOptions{});
  auto ref = (*roomy)->open_session();
  std::vector<int32_t> history = (*a)->tokens();
  history.resize(history.size() - more.size());
  ASSERT_TRUE((*ref)->append(history).ok());
  auto want = (*ref)->append(more);
  EXPECT_LE(testing::rel_l2(*after, *want), 1e-5);
}

// A session that has run (an agent's next turn) asks for more pages than are free while an older
// session's call holds the rest: its append waits for that call to end instead of failing.
TEST(Memory, ARunningSessionsNextTurnWaitsForPagesInsteadOfFailing) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_pages(dir, 8);
  const int64_t V = m->config().vocab_size;
  const auto prompt_a = random_tokens(90, V, 51), prompt_b = random_tokens(16, V, 52),
             turn_b = random_tokens(40, V, 53);
  auto a = m->open_session(), b = m->open_session();
  ASSERT_TRUE((*a)->append(prompt_a).ok());  // 6 pages
  ASSERT_TRUE((*b)->append(prompt_b).ok());  // 1 page
  GenerateOptions g;
  g.max_tokens = 20;  // 110 tokens: 7 pages, all but b's
  std::thread tb;
  Result<std::vector<float>> appended = make_error("not run");
  auto ra = (*a)->generate(g, [&](int32_t) {
    if (tb.joinable()) return true;
    tb = std::thread([&] { appended = (*b)->append(turn_b); });  // 56 tokens: 4 pages
    wait_for([&] { return m->kv_waits() == 1; });  // b is queued and waits (a is inside its call)
    return true;
  });
  tb.join();
  ASSERT_TRUE(ra.ok()) << ra.error();
  ASSERT_TRUE(appended.ok()) << appended.error();
  EXPECT_EQ(ra->tokens, reference_generation(dir, prompt_a, g));
  auto roomy = Model::load(dir, EngineOptions{});
  auto ref = (*roomy)->open_session();
  ASSERT_TRUE((*ref)->append(prompt_b).ok());
  auto want = (*ref)->append(turn_b);
  EXPECT_LE(testing::rel_l2(*appended, *want), 1e-5);
  EXPECT_EQ(m->kv_preemptions(), 0);  // b ranks below a: it waited
  EXPECT_EQ(m->kv_reclaims(), 1);     // then took a's pages when a's call ended
}

// Priorities decide who gets memory: a higher-priority newcomer is not refused while a
// lower-priority session's call holds the pages; that session is preempted, and still ends with
// the tokens it would have produced alone.
TEST(Memory, AHigherPriorityNewcomerPreemptsALowerPriorityRunner) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_pages(dir, 8);
  const int64_t V = m->config().vocab_size;
  const auto prompt = random_tokens(90, V, 61), newcomer_prompt = random_tokens(40, V, 62);
  auto runner = m->open_session(0);
  ASSERT_TRUE((*runner)->append(prompt).ok());  // 6 pages
  GenerateOptions g;
  g.max_tokens = 20;  // 110 tokens: 7 pages reserved up front, 1 free
  std::string newcomer_error = "not run";
  std::vector<float> newcomer_logits;
  auto r = (*runner)->generate(g, [&](int32_t) {
    if (newcomer_error != "not run") return true;
    auto newcomer = m->open_session(5);  // another thread in real use; here between two steps
    EXPECT_TRUE(newcomer.ok());
    auto got = (*newcomer)->append(newcomer_prompt);  // 3 pages
    newcomer_error = got.ok() ? "" : got.error();
    if (got.ok()) newcomer_logits = *got;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(newcomer_error, "");
  EXPECT_EQ(m->kv_preemptions(), 1);
  EXPECT_EQ(r->tokens, reference_generation(dir, prompt, g));
  auto roomy = Model::load(dir, EngineOptions{});
  auto ref = (*roomy)->open_session();
  auto want = (*ref)->append(newcomer_prompt);
  EXPECT_LE(testing::rel_l2(newcomer_logits, *want), 1e-5);
}

// A request waiting for memory is retried when another request is queued: here the only pages it
// could take belong to a lower-ranked session that was inside a call but not yet queued when the
// request stalled (the moment between a session call starting and its request reaching the
// scheduler). Once that request is queued the waiting one preempts it instead of both waiting.
// Driven on a Scheduler of its own, so the test decides when sessions are idle.
TEST(Memory, AWaitingRequestRetriesWhenALowerRankedOneIsQueued) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_pages(dir, 4);
  const int64_t V = m->config().vocab_size;
  Scheduler scheduler(m->network(), m->config(), 512);
  auto make_sequence = [&](uint64_t order) {
    auto s = std::make_unique<Sequence>();
    s->order = order;
    s->state.kv = std::make_unique<SequenceKv>(m->kv_pool());
    m->network().init_state(s->state);
    return s;
  };
  auto older = make_sequence(0), newer = make_sequence(1);
  std::vector<float> logits(static_cast<size_t>(V));
  ASSERT_TRUE(scheduler.append(*older, random_tokens(32, V, 71), false, logits.data()).ok());  // 2 pages
  ASSERT_TRUE(scheduler.append(*newer, random_tokens(32, V, 72), false, logits.data()).ok());  // 2: full
  const auto more_older = random_tokens(16, V, 73), more_newer = random_tokens(16, V, 74);
  std::vector<float> older_logits(static_cast<size_t>(V)), newer_logits(static_cast<size_t>(V));
  std::atomic<bool> older_done{false};
  std::thread t_older([&] {
    EXPECT_TRUE(scheduler.append(*older, more_older, false, older_logits.data()).ok());
    older_done = true;
  });
  wait_for([&] { return scheduler.kv_waits() == 1; });  // nothing to take: it waits
  std::thread t_newer([&] { EXPECT_TRUE(scheduler.append(*newer, more_newer, false, newer_logits.data()).ok()); });
  for (int i = 0; i < 1000 && !older_done; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(older_done) << "the waiting request was not retried when the newer one was queued";
  if (!older_done) scheduler.kv_released();  // unstick it, so that the test ends
  t_older.join();
  EXPECT_EQ(scheduler.preemptions(), 1);
  older->state.kv->truncate(0);  // the older session's call ended and its pages were taken
  scheduler.kv_released();
  t_newer.join();
  EXPECT_EQ(newer->rebuilt_tokens, 32);
  EXPECT_EQ(newer->tokens.size(), 48u);
  // Its logits are those of one uninterrupted run.
  auto roomy = Model::load(dir, EngineOptions{});
  auto ref = (*roomy)->open_session();
  ASSERT_TRUE((*ref)->append(random_tokens(32, V, 72)).ok());
  auto want = (*ref)->append(more_newer);
  EXPECT_LE(testing::rel_l2(newer_logits, *want), 1e-5);
}

// A session waiting for memory is not stuck there: its cancel flag ends the call promptly, as
// an append's (and, for generate, GenerateOptions::cancel) does while tokens are flowing.
TEST(Memory, AWaitingAppendEndsPromptlyWhenCancelled) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_pages(dir, 8);
  const int64_t V = m->config().vocab_size;
  auto a = m->open_session(), b = m->open_session();
  ASSERT_TRUE((*a)->append(random_tokens(90, V, 51)).ok());  // 6 pages
  ASSERT_TRUE((*b)->append(random_tokens(16, V, 52)).ok());  // 1 page
  GenerateOptions g;
  g.max_tokens = 20;  // a reserves 7 pages: b's next turn has to wait
  std::atomic<bool> cancel{false}, b_done{false};
  Result<std::vector<float>> appended = make_error("not run");
  std::thread tb;
  auto ra = (*a)->generate(g, [&](int32_t) {
    if (tb.joinable()) return true;
    tb = std::thread([&] {
      appended = (*b)->append(random_tokens(40, V, 53), false, &cancel);
      b_done = true;
    });
    wait_for([&] { return m->kv_waits() == 1; });
    cancel = true;
    wait_for([&] { return b_done.load(); });  // while a's call still holds the pages
    return true;
  });
  tb.join();
  ASSERT_TRUE(ra.ok()) << ra.error();
  ASSERT_FALSE(appended.ok());
  EXPECT_NE(appended.error().find("cancelled"), std::string::npos) << appended.error();
  EXPECT_EQ((*b)->size(), 16);
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
