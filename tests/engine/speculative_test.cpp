// Prompt-lookup speculative decoding: drafting finds the right continuation, and generating with
// drafts gives the same tokens, history, logits and GDN/KV state as without them, greedy or
// sampled, when a stop token or the budget lands inside a draft, and when the callback stops
// inside an accepted run (the unreported tokens leave the history).
#include <barrier>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "engine/engine.h"
#include "engine/prompt_lookup.h"
#include "test_math.h"
#include "test_models.h"

namespace kiln::engine {
namespace {

using testing::make_model;
using testing::random_tokens;

std::vector<int32_t> draft_of(std::vector<int32_t> history, int32_t next, int64_t max_tokens,
                              SpeculativeOptions o = {4, 2, 4}) {
  std::vector<int32_t> d{99};  // cleared first
  propose_draft(history, next, o, max_tokens, d);
  return d;
}

TEST(PromptLookup, ProposesWhatFollowedTheLatestLongestMatch) {
  // "5 6" recurs twice; the later occurrence (followed by 9 9) wins over the earlier (7 8).
  EXPECT_EQ(draft_of({5, 6, 7, 8, 1, 5, 6, 9, 9, 2, 5}, 6, 4), (std::vector<int32_t>{9, 9, 2, 5}));
  // The longest recurring suffix wins even when a shorter one recurs later: "3 5 6" → 7.
  EXPECT_EQ(draft_of({3, 5, 6, 7, 4, 5, 6, 8, 3, 5}, 6, 1), (std::vector<int32_t>{7}));
  // The continuation stops at the end of the text (it may run into the suffix itself).
  EXPECT_EQ(draft_of({1, 2, 1}, 2, 8), (std::vector<int32_t>{1, 2}));
  // Nothing recurs, or only one token when two must match: no draft.
  EXPECT_TRUE(draft_of({1, 2, 3, 4}, 5, 4).empty());
  EXPECT_TRUE(draft_of({1, 2, 3, 4}, 1, 4).empty());
  EXPECT_EQ(draft_of({1, 2, 3, 4}, 1, 4, {4, 1, 3}), (std::vector<int32_t>{2, 3, 4, 1}));
  // Off, no room, or a match only outside the window: nothing.
  EXPECT_TRUE(draft_of({5, 6, 7, 5}, 6, 4, {0, 2, 4}).empty());
  EXPECT_TRUE(draft_of({5, 6, 7, 5}, 6, 0).empty());
  std::vector<int32_t> d;
  propose_draft(std::vector<int32_t>{5, 6, 7, 0, 0, 0, 5}, 6, {4, 2, 4}, 4, d, /*window=*/4);
  EXPECT_TRUE(d.empty());
  propose_draft(std::vector<int32_t>{5, 6, 7, 0, 0, 0, 5}, 6, {4, 2, 4}, 4, d, /*window=*/8);
  EXPECT_EQ(d, (std::vector<int32_t>{7, 0, 0, 0}));
  // An empty history: nothing to match.
  EXPECT_TRUE(draft_of({}, 3, 4).empty());
}

// The draft length is what maximises expected tokens per unit of time.
TEST(PromptLookup, DraftLengthPaysOnlyWhenExpectedTokensOutweighTheCost) {
  const auto moe_cpu = [](int64_t n) { return 1 + 0.6 * double(n - 1); };  // each row reads its own experts
  const auto dense = [](int64_t n) { return 1 + 0.05 * double(n - 1); };   // weights read once per step
  const auto flat = [](int64_t) { return 1.0; };
  // One session, MoE on a CPU: a coin-flip draft costs more than it brings.
  EXPECT_EQ(draft_length(0.5, 1, 1, 8, moe_cpu), 0);
  // (1 + 0.95) / 1.6 > 1: worth one token; at 0.95 more tokens pay more.
  const int64_t likely = draft_length(0.95, 1, 1, 8, moe_cpu);
  EXPECT_GE(likely, 2);
  EXPECT_GE(draft_length(0.99, 1, 1, 8, moe_cpu), likely);
  // Only what was proposed.
  EXPECT_EQ(draft_length(0.99, 1, 1, 0, moe_cpu), 0);
  EXPECT_LE(draft_length(0.99, 1, 1, 2, moe_cpu), 2);
  // Cheap rows (a dense model): even a coin-flip draft pays, and a free one is taken whole.
  EXPECT_GE(draft_length(0.5, 1, 1, 8, dense), 1);
  EXPECT_EQ(draft_length(0.3, 1, 1, 5, flat), 5);
  // In a busy step a row adds little (16 decoding sessions already read most experts): the draft
  // refused alone pays there, while a hopeless one still does not (it slows all 16).
  const auto saturating = [](int64_t n) { return double(n) / (1 + 0.1 * double(n)); };
  EXPECT_GE(draft_length(0.5, 16, 16, 4, saturating), 1);
  EXPECT_EQ(draft_length(0.01, 16, 16, 4, saturating), 0);
  double expected = 0;
  const int64_t k = draft_length(0.9, 1, 1, 3, dense, &expected);
  EXPECT_EQ(k, 3);
  EXPECT_NEAR(expected, 0.9 + 0.81 + 0.729, 1e-9);
}

// A tiny model whose greedy output falls into repeating runs, so that drafts are both accepted
// and rejected: a small vocabulary, and the first weight seed whose greedy continuation of the
// prompt repeats itself (most random models wander; about one seed in three loops).
struct Fixture {
  std::unique_ptr<Model> model;
  std::string dir;
  std::vector<int32_t> prompt;
};

int64_t accepted_drafts(Model& m, const std::vector<int32_t>& prompt) {
  auto s = m.open_session();
  if (!s.ok() || !(*s)->append(prompt).ok()) return 0;
  GenerateOptions g;
  g.max_tokens = 60;
  g.speculative.draft_tokens = 4;
  g.speculative.adaptive = false;
  auto r = (*s)->generate(g);
  return r.ok() ? r->draft_accepted : 0;
}

Fixture load(bool moe, std::optional<cpu::WeightFormat> weights, CacheDtype cache) {
  Fixture f;
  f.prompt = random_tokens(40, 24, 17);
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    TinyModelOptions t;
    t.moe = moe;
    t.vocab = 24;
    t.tokenizer = false;
    t.seed = seed;
    if (weights) t.hidden = 128;  // whole q8 blocks
    EngineOptions o;
    o.threads = 2;
    o.weights = weights;
    o.weight_cache = false;
    o.cache_dtype = cache;
    std::string suffix = ".";  // (appended: GCC 12's -Wrestrict misreads "." + to_string)
    suffix += std::to_string(seed);
    const std::string dir = make_model(t, suffix);
    auto m = Model::load(dir, o);
    EXPECT_TRUE(m.ok()) << m.error();
    if (!m.ok()) return f;
    if (accepted_drafts(**m, f.prompt) >= 10) {
      f.model = std::move(*m);
      f.dir = dir;
      return f;
    }
  }
  ADD_FAILURE() << "no weight seed in 1..24 gave a greedy continuation that repeats itself";
  return f;
}

struct Outcome {
  GenerateResult result;
  std::vector<int32_t> history;
  std::vector<float> last_logits;
  std::vector<float> after;  // logits of a 3-token append afterwards: the caches must agree too
};

// Generates with `opts` after the prompt, stopping the callback after `stop_after` tokens (0: never).
// adaptive = false verifies every draft whole, so which drafts run does not depend on timing.
Outcome run(Model& m, const std::vector<int32_t>& prompt, GenerateOptions opts, int draft, size_t stop_after = 0,
            bool adaptive = false) {
  opts.speculative.draft_tokens = draft;
  opts.speculative.adaptive = adaptive;
  auto s = m.open_session();
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE((*s)->append(prompt).ok());
  size_t seen = 0;
  auto r = (*s)->generate(opts, [&](int32_t) { return stop_after == 0 || ++seen < stop_after; });
  EXPECT_TRUE(r.ok()) << r.error();
  Outcome out;
  out.result = *r;
  out.history = (*s)->tokens();
  out.last_logits.assign((*s)->last_logits().begin(), (*s)->last_logits().end());
  auto a = (*s)->append(std::vector<int32_t>{3, 1, 4});
  EXPECT_TRUE(a.ok());
  out.after = *a;
  return out;
}

void expect_same(const Outcome& plain, const Outcome& spec, const std::string& what) {
  EXPECT_EQ(plain.result.tokens, spec.result.tokens) << what;
  EXPECT_EQ(plain.result.reason, spec.result.reason) << what;
  EXPECT_EQ(plain.history, spec.history) << what;
  EXPECT_TRUE(plain.last_logits == spec.last_logits) << what << ": last logits differ";
  EXPECT_TRUE(plain.after == spec.after) << what << ": the caches differ (logits of a later append)";
}

struct Case {
  const char* name;
  bool moe;
  std::optional<cpu::WeightFormat> weights;
  CacheDtype cache;
};

const Case kCases[] = {{"moe_bf16", true, std::nullopt, CacheDtype::f32},
                       {"dense_bf16", false, std::nullopt, CacheDtype::f32},
                       {"moe_q8_bf16_cache", true, cpu::WeightFormat::q8, CacheDtype::bf16}};

// Each test runs on a model of its case whose greedy output repeats itself (load above).
class Speculative : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    f = load(c.moe, c.weights, c.cache);
    ASSERT_TRUE(f.model);
  }
  const Case& c = kCases[GetParam()];
  Fixture f;
};

TEST_P(Speculative, SameTokensHistoryAndStateAsPlainDecoding) {
  Model& m = *f.model;
  int64_t drafted = 0, accepted = 0;
  for (int sampled = 0; sampled < 2; ++sampled) {
    GenerateOptions g;
    g.max_tokens = 120;
    if (sampled) {
      g.sampling.temperature = 0.8f;
      g.sampling.top_k = 8;
      g.sampling.presence_penalty = 0.3f;
      g.sampling.seed = 42;
    }
    const Outcome plain = run(m, f.prompt, g, 0);
    EXPECT_EQ(plain.result.draft_tokens, 0);
    EXPECT_EQ(plain.result.steps, 120);
    for (int draft : {1, 3, 6}) {
      const Outcome spec = run(m, f.prompt, g, draft);
      expect_same(plain, spec, std::string(c.name) + (sampled ? " sampled" : " greedy") + " draft " +
                                   std::to_string(draft));
      drafted += spec.result.draft_tokens, accepted += spec.result.draft_accepted;
      // Each accepted draft token saved a step.
      EXPECT_EQ(spec.result.steps + spec.result.draft_accepted, 120);
    }
    // The adaptive policy verifies what it expects to pay (it depends on measured step times):
    // whatever it chose, the output is the same.
    const Outcome adaptive = run(m, f.prompt, g, 4, 0, true);
    expect_same(plain, adaptive, std::string(c.name) + " adaptive");
    EXPECT_EQ(adaptive.result.steps + adaptive.result.draft_accepted, 120);
  }
  // Both outcomes were exercised: drafts accepted and drafts rejected.
  std::printf("[ info ] %s: %lld of %lld draft tokens accepted\n", c.name, static_cast<long long>(accepted),
              static_cast<long long>(drafted));
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

// A stop token or the token budget inside a verified draft ends generation at the same token, with
// the rest of the draft out of the history.
TEST_P(Speculative, StopTokenAndBudgetInsideADraft) {
  Model& m = *f.model;
  GenerateOptions g;
  g.max_tokens = 80;
  const Outcome free_run = run(m, f.prompt, g, 0);
  for (size_t at : {size_t(10), size_t(25), size_t(50), size_t(70)}) {
    GenerateOptions stop = g;
    stop.stop = {free_run.result.tokens[at]};
    const Outcome plain = run(m, f.prompt, stop, 0);
    EXPECT_EQ(plain.result.reason, GenerateResult::Reason::stop_token);
    expect_same(plain, run(m, f.prompt, stop, 4), std::string(c.name) + " stop token " + std::to_string(at));
  }
  for (int64_t budget : {1, 2, 7, 33, 61}) {
    GenerateOptions b = g;
    b.max_tokens = budget;
    expect_same(run(m, f.prompt, b, 0), run(m, f.prompt, b, 5), std::string(c.name) + " budget " + std::to_string(budget));
  }
}

// A stop token inside a verified draft cuts off the positions after it. They were never judged,
// so they are not rejections: the session's acceptance estimate, which sizes its next drafts, must
// not fall for them. The same tokens ended by the budget instead (which shortens the draft, so
// nothing is cut) judge the same positions the same way.
TEST_P(Speculative, ADraftCutByAStopTokenIsNotARejection) {
  Model& m = *f.model;
  GenerateOptions g;
  g.max_tokens = 80;
  const Outcome free_run = run(m, f.prompt, g, 0);
  ASSERT_EQ(free_run.result.tokens.size(), 80u);
  int cut = 0;
  std::vector<int32_t> tried;  // a token stops generation at its first occurrence: each once
  for (size_t at = 4; at < 80; ++at) {
    if (std::find(tried.begin(), tried.end(), free_run.result.tokens[at]) != tried.end()) continue;
    tried.push_back(free_run.result.tokens[at]);
    GenerateOptions stop = g;
    stop.stop = {free_run.result.tokens[at]};
    const Outcome by_stop = run(m, f.prompt, stop, 4);
    GenerateOptions budget = g;
    budget.max_tokens = int64_t(by_stop.result.tokens.size());
    const Outcome by_budget = run(m, f.prompt, budget, 4);
    const std::string what = std::string(c.name) + " stop at " + std::to_string(at);
    ASSERT_EQ(by_stop.result.tokens, by_budget.result.tokens) << what;
    EXPECT_EQ(by_stop.result.draft_accepted, by_budget.result.draft_accepted) << what;
    EXPECT_EQ(by_stop.result.draft_rejected, by_budget.result.draft_rejected) << what;
    EXPECT_EQ(by_stop.result.draft_acceptance, by_budget.result.draft_acceptance) << what;
    EXPECT_LE(by_stop.result.draft_accepted + by_stop.result.draft_rejected, by_stop.result.draft_tokens) << what;
    cut += by_stop.result.draft_tokens > by_budget.result.draft_tokens;
  }
  EXPECT_GT(cut, 0) << "no stop token fell inside a draft: nothing was tested";
}

// The callback returning false after token k: that token is the last in the history, whether it
// came from a plain step or from the middle of an accepted draft (then rolled back to its state).
TEST_P(Speculative, CallbackStopInsideAnAcceptedRunRollsBack) {
  Model& m = *f.model;
  GenerateOptions g;
  g.max_tokens = 100;
  const Outcome spec_free = run(m, f.prompt, g, 4);
  ASSERT_GT(spec_free.result.draft_accepted, 0) << "no draft was accepted: nothing to roll back";
  for (size_t k = 1; k < 100; ++k) {
    const Outcome plain = run(m, f.prompt, g, 0, k);
    const Outcome spec = run(m, f.prompt, g, 4, k);
    EXPECT_EQ(plain.result.reason, GenerateResult::Reason::callback);
    EXPECT_EQ(plain.result.tokens.size(), k);
    expect_same(plain, spec, std::string(c.name) + " callback stops after " + std::to_string(k));
  }
}

#if defined(__x86_64__)
// The rollback of a callback stop replays GDN steps on the session's own thread. An embedder may
// have left another rounding mode there (here round toward zero): the replay still runs in the
// engine's mode and reaches the scheduler's bits, so history, logits and caches match plain decoding.
TEST_P(Speculative, RollbackOnTheSessionThreadIgnoresItsRoundingMode) {
  Model& m = *f.model;
  GenerateOptions g;
  g.max_tokens = 60;
  const unsigned standard = _mm_getcsr();
  constexpr unsigned kRoundTowardZero = 0x6000;  // MXCSR RC bits
  int rolled_back = 0;
  for (size_t k = 1; k < 60; ++k) {
    const Outcome plain = run(m, f.prompt, g, 0, k);
    _mm_setcsr(standard | kRoundTowardZero);
    const Outcome spec = run(m, f.prompt, g, 4, k);
    _mm_setcsr(standard);
    expect_same(plain, spec, std::string(c.name) + " round toward zero, callback stops after " + std::to_string(k));
    // Forwarded beyond the k reported tokens: the stop fell inside an accepted run, rolled back.
    rolled_back += spec.result.steps + spec.result.draft_accepted > int64_t(k);
  }
  // The MoE fixtures accept drafts of several tokens; the dense one's prompt lookup proposes one
  // at a time here, and a stop never falls inside a run of one.
  if (c.moe) {
    EXPECT_GT(rolled_back, 0) << "no stop fell inside an accepted draft: nothing was replayed";
  }
}
#endif

// Four sessions decoding at once (with drafts, or without) in a KV pool too small for all of
// them: drafts fall back to single tokens when pages are short, sessions wait, or are preempted
// (or reclaimed while idle) and restored, and every session still ends with exactly the history
// it has alone without drafts: a restore replays the history's own steps, so it recomputes the
// same bits.
TEST_P(Speculative, ConcurrentSessionsUnderMemoryPressureMatchSoloRuns) {
  constexpr int kSessions = 4;
  GenerateOptions g;
  g.max_tokens = 50;
  std::vector<std::vector<int32_t>> prompts, want;
  for (int i = 0; i < kSessions; ++i) {
    prompts.push_back(i == 0 ? f.prompt : random_tokens(30, 24, 100 + uint64_t(i)));
    // Sessions 1 and 3 stop from their callback (anywhere, maybe inside an accepted run).
    want.push_back(run(*f.model, prompts.back(), g, 0, i % 2 ? size_t(17 + 6 * i) : 0).history);
  }
  EngineOptions o = f.model->options();
  o.max_sessions = kSessions;
  o.kv_budget_bytes = kSessions * f.model->plan().state_bytes_per_session + 9 * f.model->plan().page_bytes;
  auto tight = Model::load(f.dir, o);
  ASSERT_TRUE(tight.ok()) << tight.error();
  Model& m = **tight;
  ASSERT_EQ(m.plan().pages, 9);  // 144 tokens: the prompts (40 + 3 × 30) fill it; contexts reach 80–90
  for (int draft : {4, 0}) {
    std::barrier prefilled(kSessions);
    std::vector<std::vector<int32_t>> got(kSessions);
    std::vector<GenerateResult> results(kSessions);
    std::vector<std::thread> threads;
    const int64_t short_before = m.kv_waits() + m.kv_preemptions() + m.kv_reclaims();
    for (int i = 0; i < kSessions; ++i)
      threads.emplace_back([&, i] {
        auto s = m.open_session();
        const bool open = s.ok() && (*s)->append(prompts[size_t(i)]).ok();  // 3 + 2 + 2 + 2 pages
        EXPECT_TRUE(open) << "session " << i;
        prefilled.arrive_and_wait();  // all prefilled before any generates: the pool runs short
        if (!open) return;
        GenerateOptions spec = g;
        spec.speculative = {draft, 2, 4, false};
        size_t seen = 0;
        const size_t stop_after = i % 2 ? size_t(17 + 6 * i) : 0;
        auto r = (*s)->generate(spec, [&](int32_t) { return stop_after == 0 || ++seen < stop_after; });
        ASSERT_TRUE(r.ok()) << r.error();
        results[size_t(i)] = *r;
        got[size_t(i)] = (*s)->tokens();
      });
    for (auto& t : threads) t.join();
    int64_t drafted = 0;
    for (int i = 0; i < kSessions; ++i) {
      EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << c.name << " draft " << draft << " session " << i;
      drafted += results[size_t(i)].draft_tokens;
    }
    if (draft > 0) {
      EXPECT_GT(drafted, 0);
    }
    EXPECT_GT(m.kv_waits() + m.kv_preemptions() + m.kv_reclaims(), short_before) << "the pool never ran short";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Speculative, ::testing::Range(0, 3),
                         [](const auto& info) { return std::string(kCases[info.param].name); });

}  // namespace
}  // namespace kiln::engine
