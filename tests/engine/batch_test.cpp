// Batching must not change results: a sequence's logits are the same whether its steps run alone
// or batched with others (mixed prefill lengths and decodes), on exact (f32, bf16) and q8
// weights; chunked prefill equals one-shot prefill within the prefill/decode tolerance; sessions
// on 8 threads through the scheduler match sequential runs.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "test_models.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::rel_l2;
using testing::random_tokens;

using testing::make_model;



int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// A sequence driven directly through Qwen35Model::forward_batch.
struct Seq {
  SequenceState st;
  std::vector<int32_t> tokens;  // what the next step feeds
  std::vector<float> logits;
};

Seq new_seq(Model& m) {
  Seq s;
  s.st.dtype = m.options().cache_dtype;
  s.st.kv = std::make_unique<SequenceKv>(m.kv_pool());
  m.network().init_state(s.st);
  return s;
}

// Runs one step of every sequence in `batch` (all logits), alone (one forward each) or together.
void step(Model& m, std::vector<Seq*> batch, bool together) {
  const int64_t V = m.config().vocab_size;
  std::vector<SeqStep> steps;
  for (Seq* s : batch) {
    ASSERT_TRUE(s->st.kv->reserve(s->st.n_past + int64_t(s->tokens.size())).ok());
    s->logits.assign(s->tokens.size() * size_t(V), 0.0f);
    steps.push_back({s->tokens.data(), int64_t(s->tokens.size()), &s->st, LogitRows::all, s->logits.data()});
  }
  if (together) {
    StepStats stats;
    m.network().forward_batch(steps, &stats);
    EXPECT_EQ(stats.rows, int64_t([&] { size_t n = 0; for (Seq* s : batch) n += s->tokens.size(); return n; }()));
  } else {
    for (const SeqStep& s : steps) m.network().forward_batch(std::span<const SeqStep>(&s, 1));
  }
}

struct Case {
  const char* name;
  TinyModelOptions tiny;
  std::optional<cpu::WeightFormat> weights;
  CacheDtype cache = CacheDtype::f32;
};

std::vector<Case> cases() {
  TinyModelOptions bf16;  // MoE, bf16 as stored
  TinyModelOptions f32;
  f32.dtype = Dtype::f32;
  f32.moe = false;
  f32.linear_key_heads = 3, f32.linear_value_heads = 9, f32.linear_key_head_dim = 8, f32.linear_value_head_dim = 12;
  f32.heads = 6, f32.kv_heads = 3, f32.head_dim = 16, f32.hidden = 48;
  TinyModelOptions q8 = bf16;
  q8.hidden = 128;  // q8 blocks need whole blocks of columns
  q8.seed = 3;
  return {{"moe_bf16", bf16, std::nullopt},
          {"dense_f32", f32, std::nullopt},
          {"moe_q8", q8, cpu::WeightFormat::q8},
          // bf16 KV pages and conv windows: the rounding happens once, when a row is stored, so
          // batched and solo runs still read the same bits.
          {"moe_q8_bf16_cache", q8, cpu::WeightFormat::q8, CacheDtype::bf16}};
}

class Batched : public ::testing::TestWithParam<int> {};

// Eight sequences with prompts of 1..200 tokens, then decode steps where one sequence brings a
// 3-token append: the batched run's logits equal the solo run's at every step.
TEST_P(Batched, LogitsEqualSoloRuns) {
  const Case c = cases()[size_t(GetParam())];
  EngineOptions o;
  o.weights = c.weights;
  o.weight_cache = false;
  o.cache_dtype = c.cache;
  auto model = Model::load(make_model(c.tiny), o);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  if (c.weights) {
    ASSERT_EQ(m.weights().lm_head.dtype, Dtype::q8);
  }
  ASSERT_EQ(m.options().cache_dtype, c.cache);
  const int64_t V = m.config().vocab_size;
  const int64_t lengths[8] = {5, 200, 1, 64, 70, 130, 17, 33};
  std::vector<Seq> solo, batch;
  for (int i = 0; i < 8; ++i) {
    solo.push_back(new_seq(m)), batch.push_back(new_seq(m));
    solo.back().tokens = batch.back().tokens = random_tokens(lengths[i], V, uint64_t(i) + 11);
  }
  double worst = 0;
  int64_t compared = 0, identical = 0;
  for (int s = 0; s < 6; ++s) {
    std::vector<Seq*> a, b;
    for (int i = 0; i < 8; ++i) a.push_back(&solo[size_t(i)]), b.push_back(&batch[size_t(i)]);
    step(m, a, false);
    step(m, b, true);
    for (int i = 0; i < 8; ++i) {
      const Seq &x = solo[size_t(i)], &y = batch[size_t(i)];
      ASSERT_EQ(x.logits.size(), y.logits.size());
      const double rel = rel_l2(y.logits.data(), x.logits.data(), int64_t(x.logits.size()));
      worst = std::max(worst, rel);
      // Issue 10 asks ≤ 1e-5; every kernel computes a row's outputs independently of the
      // other rows of the step (and attention splits by context length only), so it is exact.
      EXPECT_TRUE(x.logits == y.logits) << c.name << " step " << s << " sequence " << i << ": rel L2 " << rel;
      ++compared, identical += x.logits == y.logits;
      // Next step: greedy decode; sequence 3 appends three tokens instead.
      const int32_t next = argmax(&x.logits[x.logits.size() - size_t(V)], V);
      std::vector<int32_t> t = i == 3 ? std::vector<int32_t>{next, 7, 9} : std::vector<int32_t>{next};
      solo[size_t(i)].tokens = batch[size_t(i)].tokens = t;
    }
  }
  std::printf("[ info ] %s: %lld of %lld sequence steps bit-identical, worst rel L2 %.3g\n", c.name,
              static_cast<long long>(identical), static_cast<long long>(compared), worst);
}

INSTANTIATE_TEST_SUITE_P(Weights, Batched, ::testing::Range(0, 4),
                         [](const auto& info) { return std::string(cases()[size_t(info.param)].name); });

// Prefill cut into scheduler chunks (48 tokens: not a multiple of the delta rule's 64) equals one
// prefill, within the prefill/decode tolerances of consistency_test.
TEST(ChunkedPrefill, EqualsOneShotPrefill) {
  const std::string dir = make_model(TinyModelOptions{});
  EngineOptions whole, chunked;
  whole.prefill_chunk = 4096;
  chunked.prefill_chunk = 48;
  auto a = Model::load(dir, whole);
  auto b = Model::load(dir, chunked);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t V = (*a)->config().vocab_size;
  const auto toks = random_tokens(300, V, 77);
  auto sa = (*a)->open_session();
  auto sb = (*b)->open_session();
  auto la = (*sa)->append(toks, true);
  (*b)->scheduler().clear_step_log();
  auto lb = (*sb)->append(toks, true);
  ASSERT_TRUE(la.ok() && lb.ok());
  const auto log = (*b)->scheduler().step_log();
  ASSERT_EQ(log.size(), 7u);  // ⌈300/48⌉ chunks, one per step
  EXPECT_EQ(log[0].prefill_rows, 48);
  EXPECT_EQ(log.back().prefill_rows, 300 - 6 * 48);
  EXPECT_LE(rel_l2(lb->data(), la->data(), 300 * V), 1e-5);
  for (int64_t t = 0; t < 300; ++t) EXPECT_LE(rel_l2(&(*lb)[size_t(t * V)], &(*la)[size_t(t * V)], V), 5e-5) << t;
  EXPECT_EQ((*sb)->size(), 300);
  EXPECT_EQ((*sb)->tokens(), toks);
  // Generation continues from the chunked prefill like from the whole one.
  GenerateOptions g;
  g.max_tokens = 8;
  auto ga = (*sa)->generate(g);
  auto gb = (*sb)->generate(g);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(ga->tokens, gb->tokens);
}

// A cancelled prefill stops between chunks (a cancelled build must not wait out a whole
// conversation's prefill); the chunks that ran stay, and appending the rest gives the logits of
// one uninterrupted prefill.
TEST(ChunkedPrefill, CancelStopsBetweenChunksAndTheRestCanFollow) {
  EngineOptions o;
  o.prefill_chunk = 4;
  auto model = Model::load(make_model(TinyModelOptions{}), o);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  const int64_t V = m.config().vocab_size;
  const auto toks = random_tokens(1200, V, 91);
  auto fresh = m.open_session();
  auto whole = (*fresh)->append(toks);
  ASSERT_TRUE(whole.ok());

  // Cancelled before it starts: nothing runs, nothing changes.
  auto s = m.open_session();
  ASSERT_TRUE(s.ok());
  std::atomic<bool> cancel{true};
  auto none = (*s)->append(toks, false, &cancel);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().find("cancelled after 0 of 1200 tokens"), std::string::npos) << none.error();
  EXPECT_EQ((*s)->size(), 0);

  // Cancelled mid-way (from another thread, once two steps ran): a few tries, in case a loaded
  // machine wakes the canceller only after all 300 chunks are done.
  int64_t ran = 0;
  for (int attempt = 0; attempt < 5 && ran == 0; ++attempt) {
    s = m.open_session();
    cancel = false;
    m.scheduler().clear_step_log();
    std::thread canceller([&] {
      while (m.scheduler().step_log().size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      cancel = true;
    });
    auto cut = (*s)->append(toks, false, &cancel);
    canceller.join();
    if (cut.ok()) continue;
    EXPECT_NE(cut.error().find("cancelled after"), std::string::npos) << cut.error();
    ran = (*s)->size();
  }
  ASSERT_GT(ran, 0) << "the prefill was never cut";
  EXPECT_LT(ran, 1200);
  EXPECT_EQ(ran % 4, 0);
  EXPECT_TRUE(std::equal((*s)->tokens().begin(), (*s)->tokens().end(), toks.begin()));
  EXPECT_TRUE((*s)->last_logits().empty());
  EXPECT_FALSE((*s)->generate(GenerateOptions{}).ok());  // no logits to sample from
  auto rest = (*s)->append(std::span(toks).subspan(size_t(ran)));
  ASSERT_TRUE(rest.ok()) << rest.error();
  EXPECT_LE(rel_l2(rest->data(), whole->data(), V), 5e-5);
  EXPECT_EQ((*s)->tokens(), toks);
}

// Eight threads, each with its own session: prefill (some longer than a chunk) then generate,
// all at once through the scheduler; the results equal the same calls made one at a time.
TEST(Scheduler, ConcurrentSessionsMatchSequentialRuns) {
  EngineOptions o;
  o.prefill_chunk = 64;
  auto model = Model::load(make_model(TinyModelOptions{}), o);
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  const int64_t V = m.config().vocab_size;
  struct Out {
    std::vector<float> prefill;
    std::vector<int32_t> generated, streamed, history;
    GenerateResult::Reason reason{};
  };
  auto run = [&](int i, Out& out) {
    auto s = m.open_session();
    ASSERT_TRUE(s.ok()) << s.error();
    auto l = (*s)->append(random_tokens(20 + 37 * i, V, uint64_t(i)), true);
    ASSERT_TRUE(l.ok()) << l.error();
    out.prefill = *l;
    GenerateOptions g;
    g.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    g.sampling.top_k = 40;
    g.sampling.seed = uint64_t(i);
    g.max_tokens = 10 + i;
    auto r = (*s)->generate(g, [&](int32_t t) {
      out.streamed.push_back(t);
      return i != 5 || out.streamed.size() < 4;  // session 5 stops itself after 4 tokens
    });
    ASSERT_TRUE(r.ok()) << r.error();
    out.generated = r->tokens;
    out.reason = r->reason;
    out.history = (*s)->tokens();
  };
  std::vector<Out> expected(8), got(8);
  for (int i = 0; i < 8; ++i) run(i, expected[size_t(i)]);
  m.scheduler().clear_step_log();
  std::barrier start(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      run(i, got[size_t(i)]);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    const Out &e = expected[size_t(i)], &g = got[size_t(i)];
    EXPECT_LE(rel_l2(g.prefill.data(), e.prefill.data(), int64_t(e.prefill.size())), 1e-5) << i;
    EXPECT_EQ(g.generated, e.generated) << i;
    EXPECT_EQ(g.streamed, g.generated) << i;  // every reported token is in the history, and no other
    EXPECT_EQ(g.history, e.history) << i;
    EXPECT_EQ(g.reason, e.reason) << i;
  }
  EXPECT_EQ(got[5].generated.size(), 4u);
  EXPECT_EQ(got[5].reason, GenerateResult::Reason::callback);
  EXPECT_EQ(got[7].generated.size(), 17u);
  int max_decoders = 0;
  for (const StepRecord& r : m.scheduler().step_log()) max_decoders = std::max(max_decoders, r.decode_rows);
  EXPECT_GE(max_decoders, 2) << "decode steps of different sessions were never batched";
}

}  // namespace
}  // namespace kiln::engine
