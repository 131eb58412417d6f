// Algorithmic twins inside the engine: prefill (chunked delta rule) vs decode (recurrent) vs
// split, across the chunk boundary, on make-tiny models of several shapes; rewind then re-append
// gives bit-identical logits; determinism of generate.
#include <chrono>
#include <cmath>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "engine/engine.h"
#include "test_models.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::rel_l2;
using testing::random_tokens;

using testing::make_model;



// All-position logits with the first `split` tokens prefilled and the rest decoded one by one.
std::vector<float> run(Model& m, const std::vector<int32_t>& toks, int64_t split) {
  auto s = m.open_session();
  EXPECT_TRUE(s.ok()) << s.error();
  std::vector<float> all;
  if (split > 0) {
    auto l = (*s)->append(std::span<const int32_t>(toks.data(), size_t(split)), true);
    EXPECT_TRUE(l.ok()) << l.error();
    all = *l;
  }
  for (size_t i = size_t(split); i < toks.size(); ++i) {
    auto l = (*s)->append(std::span<const int32_t>(&toks[i], 1));
    EXPECT_TRUE(l.ok()) << l.error();
    all.insert(all.end(), l->begin(), l->end());
  }
  return all;
}

struct Shape {
  const char* name;
  TinyModelOptions options;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  TinyModelOptions moe;  // defaults: MoE, 4 layers, hidden 64, packed, bf16
  s.push_back({"moe_bf16_packed", moe});
  TinyModelOptions dense;
  dense.moe = false;
  dense.dtype = Dtype::f32;
  dense.layers = 5;
  dense.hidden = 48;
  dense.heads = 6, dense.kv_heads = 3, dense.head_dim = 16, dense.partial_rotary_factor = 0.5;
  dense.linear_key_heads = 3, dense.linear_value_heads = 9, dense.linear_key_head_dim = 8;
  dense.linear_value_head_dim = 12;
  s.push_back({"dense_f32_r3", dense});
  TinyModelOptions per_expert;
  per_expert.per_expert = true;
  per_expert.shards = 3;
  per_expert.layers = 8;
  per_expert.full_attention_interval = 2;
  per_expert.experts = 6, per_expert.top_k = 3, per_expert.shared_expert_intermediate = 0;
  per_expert.seed = 7;
  s.push_back({"moe_per_expert_sharded_noshared", per_expert});
  return s;
}

// Prefill and decode differ only in the delta-rule form (chunked, solved in double, vs recurrent
// with the f32 state rounded after every token). Random-weight models amplify that rounding (the
// golden README: f32 vs f64 moves their logits by 5–9e-6), the more so the smaller the heads: on
// the hidden-48, dk-8 shape below single positions reach ~3e-5 while whole sequences stay < 1e-5.
constexpr double kSequenceTol = 1e-5;
constexpr double kPositionTol = 5e-5;

class Twins : public ::testing::TestWithParam<int> {};

TEST_P(Twins, PrefillDecodeAndSplitAgreeAcrossChunkBoundary) {
  const Shape shape = shapes()[size_t(GetParam())];
  auto model = Model::load(make_model(shape.options));
  ASSERT_TRUE(model.ok()) << model.error();
  Model& m = **model;
  const int64_t V = m.config().vocab_size;
  for (int64_t n : {1, 63, 64, 65, 200}) {
    const auto toks = random_tokens(n, V, uint64_t(n) * 31 + 5);
    const auto prefill = run(m, toks, n);
    const auto decode = run(m, toks, 0);
    const auto split = run(m, toks, n / 2 + 1);
    ASSERT_EQ(prefill.size(), size_t(n * V));
    ASSERT_EQ(decode.size(), prefill.size());
    ASSERT_EQ(split.size(), prefill.size());
    // Whole sequence: ‖decode − prefill‖ / ‖prefill‖ over all positions.
    EXPECT_LE(rel_l2(decode.data(), prefill.data(), n * V), kSequenceTol) << shape.name << " n=" << n << " decode";
    EXPECT_LE(rel_l2(split.data(), prefill.data(), n * V), kSequenceTol) << shape.name << " n=" << n << " split";
    for (int64_t t = 0; t < n; ++t) {
      const float* p = &prefill[size_t(t * V)];
      EXPECT_LE(rel_l2(&decode[size_t(t * V)], p, V), kPositionTol) << shape.name << " n=" << n << " decode pos " << t;
      EXPECT_LE(rel_l2(&split[size_t(t * V)], p, V), kPositionTol) << shape.name << " n=" << n << " split pos " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Twins, ::testing::Range(0, 3),
                         [](const auto& info) { return std::string(shapes()[size_t(info.param)].name); });

// The bf16 cache (a serving option) against the exact f32 cache, on every shape: the same logits
// up to the rounding of what is stored. In prefill that is the K/V rows alone (the conv runs over
// the chunk in f32); in decode every token's conv inputs are also rounded before three of the
// four taps read them, which random-weight models amplify (and MoE routing flips further).
TEST_P(Twins, Bf16CacheStaysNearTheExactCache) {
  const Shape shape = shapes()[size_t(GetParam())];
  const std::string dir = make_model(shape.options);
  EngineOptions exact, rounded;
  rounded.cache_dtype = CacheDtype::bf16;
  auto a = Model::load(dir, exact);
  auto b = Model::load(dir, rounded);
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t V = (*a)->config().vocab_size, n = 90;
  const auto toks = random_tokens(n, V, 5);
  const auto pa = run(**a, toks, n), pb = run(**b, toks, n);
  const auto sa = run(**a, toks, 40), sb = run(**b, toks, 40);
  const double prefill = rel_l2(pb.data(), pa.data(), n * V), split = rel_l2(sb.data(), sa.data(), n * V);
  std::printf("[ info ] %s: bf16 vs f32 cache, rel L2 %.2e (prefill), %.2e (prefill 40, decode 50)\n",
              shape.name, prefill, split);
  EXPECT_GT(prefill, 0.0);  // the cache really is bf16
  EXPECT_LT(prefill, 5e-3) << shape.name;
  EXPECT_LT(split, 0.2) << shape.name;
}

TEST(Session, RewindThenReappendGivesIdenticalLogits) {
  auto model = Model::load(make_model(TinyModelOptions{}));
  ASSERT_TRUE(model.ok()) << model.error();
  auto s = (*model)->open_session();
  ASSERT_TRUE(s.ok());
  const auto a = random_tokens(70, 256, 1), b = random_tokens(40, 256, 2), c = random_tokens(9, 256, 3);
  ASSERT_TRUE((*s)->append(a).ok());
  const SessionCheckpoint cp = (*s)->checkpoint();
  auto first = (*s)->append(b, true);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*s)->append(c).ok());  // more history, then go back
  ASSERT_TRUE((*s)->rewind(cp).ok());
  EXPECT_EQ((*s)->size(), 70);
  auto again = (*s)->append(b, true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first, *again);  // bit-identical: same state, same kernels, same thread split
}

TEST(Session, RewindRefusesACheckpointThatIsNotAPrefix) {
  auto model = Model::load(make_model(TinyModelOptions{}));
  ASSERT_TRUE(model.ok()) << model.error();
  auto s = (*model)->open_session();
  const SessionCheckpoint early = (*s)->checkpoint();
  ASSERT_TRUE((*s)->append(random_tokens(10, 256, 1)).ok());
  const SessionCheckpoint late = (*s)->checkpoint();
  ASSERT_TRUE((*s)->rewind(early).ok());
  ASSERT_TRUE((*s)->append(random_tokens(12, 256, 9)).ok());
  Status st = (*s)->rewind(late);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().find("not a prefix"), std::string::npos) << st.error();
  // An empty checkpoint of a model with as many layers but other state sizes is refused too.
  TinyModelOptions wider;
  wider.linear_value_head_dim = 32;
  auto other = Model::load(make_model(wider, "-wider"));
  ASSERT_TRUE(other.ok()) << other.error();
  auto os = (*other)->open_session();
  Status foreign = (*s)->rewind((*os)->checkpoint());
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.error().find("another model"), std::string::npos) << foreign.error();
}

TEST(Session, AppendingToALongSessionOnlyComputesTheNewTokens) {
  // Appending after a long prefix must equal a full prefill (cache reuse is right), position by position.
  auto model = Model::load(make_model(TinyModelOptions{}));
  ASSERT_TRUE(model.ok()) << model.error();
  const auto toks = random_tokens(150, 256, 4);
  auto whole = run(**model, toks, 150);
  auto s = (*model)->open_session();
  ASSERT_TRUE((*s)->append(std::span<const int32_t>(toks.data(), 140)).ok());
  auto tail = (*s)->append(std::span<const int32_t>(toks.data() + 140, 10), true);
  ASSERT_TRUE(tail.ok());
  const int64_t V = (*model)->config().vocab_size;
  for (int t = 0; t < 10; ++t) EXPECT_LE(rel_l2(&(*tail)[size_t(t * V)], &whole[size_t((140 + t) * V)], V), 1e-5);
}

TEST(Session, SessionsOnSeparateThreadsMatchSequentialRuns) {
  auto model = Model::load(make_model(TinyModelOptions{}));
  ASSERT_TRUE(model.ok()) << model.error();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> expected, got(4);
  for (uint64_t i = 0; i < 4; ++i) {
    prompts.push_back(random_tokens(90, 256, 100 + i));
    expected.push_back(run(**model, prompts.back(), 70));  // prefill 70, decode 20
  }
  std::vector<std::thread> threads;  // one session per thread, all sharing the model
  for (size_t i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = run(**model, prompts[i], 70); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], expected[i]) << "session " << i;
}

#if defined(__x86_64__)
// The scheduler and pool threads inherit the float mode of the thread that loads the model; they
// reset it to the engine's, and loading (quantizing) runs in it too, so a model loaded (and used)
// from a thread rounding toward zero gives the same logits as one loaded from a standard thread.
TEST(Session, LogitsDoNotDependOnTheCallersRoundingMode) {
  TinyModelOptions tiny;
  tiny.hidden = 128;  // whole q8 blocks
  const std::string dir = make_model(tiny);
  const auto prompt = random_tokens(40, 256, 5);
  // Exact weights, and q8 quantized at load (on the loading thread and the pool's workers; its
  // quantizer rounds to nearest explicitly, so only a scale product's last bit could move there).
  for (const std::optional<cpu::WeightFormat> weights : {std::optional<cpu::WeightFormat>(), std::optional(cpu::WeightFormat::q8)}) {
    EngineOptions o;
    o.threads = 2;
    o.weights = weights;
    o.weight_cache = false;  // each load quantizes itself
    auto standard_model = Model::load(dir, o);
    ASSERT_TRUE(standard_model.ok()) << standard_model.error();
    const auto want = run(**standard_model, prompt, 30);
    const unsigned standard = _mm_getcsr();
    _mm_setcsr(standard | 0x6000);  // MXCSR RC bits: round toward zero
    auto model = Model::load(dir, o);
    const auto got = model.ok() ? run(**model, prompt, 30) : std::vector<float>();
    model = make_error("unloaded");  // the threads stop while the mode is still set
    _mm_setcsr(standard);
    EXPECT_TRUE(got == want) << (weights ? "q8" : "exact") << ": logits changed with the loading thread's rounding mode";
  }
}
#endif

TEST(Generate, SameSeedSameTokensAndStopsOnStopToken) {
  auto model = Model::load(make_model(TinyModelOptions{}));
  ASSERT_TRUE(model.ok()) << model.error();
  GenerateOptions o;
  o.sampling.temperature = 1.0f;
  o.sampling.top_k = 50;
  o.sampling.seed = 42;
  o.max_tokens = 24;
  std::vector<std::vector<int32_t>> outs;
  for (int rep = 0; rep < 2; ++rep) {
    auto s = (*model)->open_session();
    ASSERT_TRUE((*s)->append(random_tokens(5, 256, 8)).ok());
    std::vector<int32_t> streamed;
    auto r = (*s)->generate(o, [&](int32_t t) { streamed.push_back(t); return true; });
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(streamed, r->tokens);
    EXPECT_EQ((*s)->size(), 5 + int64_t(r->tokens.size()));
    outs.push_back(r->tokens);
  }
  EXPECT_EQ(outs[0], outs[1]);
  ASSERT_EQ(outs[0].size(), 24u);
  // Stop at the 4th token's value: generation ends right there.
  o.stop = {outs[0][3]};
  auto s = (*model)->open_session();
  ASSERT_TRUE((*s)->append(random_tokens(5, 256, 8)).ok());
  auto r = (*s)->generate(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason, GenerateResult::Reason::stop_token);
  EXPECT_LE(r->tokens.size(), 4u);
  EXPECT_EQ(r->tokens.back(), outs[0][3]);
}

// A generate that hits the context limit while its callback is still running (the callback runs
// ahead of the step) ends with the error and leaves the scheduler whole: other sessions go on.
// Before, both the scheduler and the session thread removed the request from the queue.
TEST(Generate, ErrorDuringASlowCallbackLeavesTheSchedulerWhole) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 64;
  auto model = Model::load(make_model(tiny));
  ASSERT_TRUE(model.ok()) << model.error();
  for (int rep = 0; rep < 3; ++rep) {
    auto s = (*model)->open_session();
    ASSERT_TRUE((*s)->append(random_tokens(61, 256, 9)).ok());
    GenerateOptions o;
    o.max_tokens = 10;
    int seen = 0;
    auto r = (*s)->generate(o, [&](int32_t) {
      ++seen;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return true;
    });
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("exceeds max_position_embeddings"), std::string::npos) << r.error();
    EXPECT_EQ((*s)->size(), 64);
    // The scheduler still serves: a new session's append returns (a hang fails by the timeout).
    auto other = (*model)->open_session();
    auto done = std::async(std::launch::async, [&] { return (*other)->append(random_tokens(8, 256, 10)).ok(); });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_TRUE(done.get());
  }
}

// A callback that says stop on the very token whose forward then fails (the context is full)
// ends generate() with the error instead of waiting forever for that forward.
TEST(Generate, StopOnATokenThatCannotBeForwardedEndsWithTheError) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 64;
  auto model = Model::load(make_model(tiny));
  ASSERT_TRUE(model.ok()) << model.error();
  auto s = (*model)->open_session();
  ASSERT_TRUE((*s)->append(random_tokens(64, 256, 11)).ok());
  GenerateOptions o;
  o.max_tokens = 4;
  auto done = std::async(std::launch::async, [&] {  // the error, or "" if it succeeded
    auto r = (*s)->generate(o, [](int32_t) { return false; });
    return r.ok() ? std::string() : r.error();
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::string error = done.get();
  EXPECT_NE(error.find("exceeds max_position_embeddings"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln::engine
