// Capacity planning on the real configs (examples/models) and sampling behaviour.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/capacity.h"
#include "engine/config.h"
#include "engine/sampling.h"

namespace kiln::engine {
namespace {

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/models/";

TEST(Capacity, Real35BA3BHoldsAtLeastWhatVllmReportsAt36GiB) {
  auto c = load_model_config(kExamples + "qwen3.6-35b-a3b.config.json");
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->n_full_layers(), 10);
  EXPECT_EQ(c->n_linear_layers(), 30);
  const CapacityPlan p = plan_capacity(*c, parse_bytes("36GiB"), 16, CacheDtype::bf16);
  EXPECT_EQ(p.kv_bytes_per_token, 20480);             // model-spec §4.1
  EXPECT_EQ(p.state_bytes_per_session, 64389120);     // 30 × (49,152 conv + 2,097,152 recurrent)
  EXPECT_GE(p.kv_tokens, 1837064);                    // vLLM's figure for the same budget
  EXPECT_LE(p.kv_tokens, 1837132);                    // and no more than the naive bound
  EXPECT_EQ(p.full_length_sessions, p.pages / (262144 / 16));
}

// Sessions that verify drafts of 8 tokens also hold, while generating, the GDN states at the
// step's start, 8 positions' GDN inputs per linear layer and 9 rows of logits (and the batch's
// gathered copy of them): planned as fixed state, so fewer KV pages fit in the same budget.
TEST(Capacity, SpeculativeScratchIsPlannedPerSession) {
  auto c = load_model_config(kExamples + "qwen3.6-35b-a3b.config.json");
  ASSERT_TRUE(c.ok()) << c.error();
  const CapacityPlan plain = plan_capacity(*c, parse_bytes("36GiB"), 16, CacheDtype::bf16);
  const CapacityPlan spec = plan_capacity(*c, parse_bytes("36GiB"), 16, CacheDtype::bf16, 16, 8);
  EXPECT_EQ(plain.speculative_bytes_per_session, 0);
  // 64,389,120 (states) + 8 × 30 × (8,192 qkv + 4,096 z + 32 b + 32 a) × 4 + 2 × 9 × 248,320 × 4
  EXPECT_EQ(spec.speculative_bytes_per_session, 64389120 + 11857920 + 2 * 8939520);
  EXPECT_EQ(spec.state_bytes_per_session, plain.state_bytes_per_session);
  EXPECT_EQ(spec.pages, (parse_bytes("36GiB") - int64_t{16} * (64389120 + 94126080)) / spec.page_bytes);
  EXPECT_LT(spec.kv_tokens, plain.kv_tokens);
  EXPECT_NE(spec.to_text().find("speculative scratch bytes per session (drafts of 8): 94126080"), std::string::npos)
      << spec.to_text();
  // The auto budget gives every session its scratch on top of its state and KV.
  EXPECT_EQ(kv_budget_for(*c, 4, CacheDtype::bf16, 4096, 16, 8) - kv_budget_for(*c, 4, CacheDtype::bf16, 4096),
            4 * spec.speculative_bytes_per_session);
}

TEST(Capacity, Dense27BMatchesNaiveAccounting) {
  auto c = load_model_config(kExamples + "qwen3.6-27b.config.json");
  ASSERT_TRUE(c.ok()) << c.error();
  const CapacityPlan p = plan_capacity(*c, parse_bytes("36GiB"), 16, CacheDtype::bf16);
  EXPECT_EQ(p.kv_bytes_per_token, 65536);
  EXPECT_EQ(p.state_bytes_per_session, 153944064);
  EXPECT_EQ(p.kv_tokens, 552240);
}

TEST(Capacity, CacheDtypeNamesRoundTripAndRejectOthers) {
  for (CacheDtype d : {CacheDtype::f32, CacheDtype::bf16}) EXPECT_EQ(parse_cache_dtype(cache_dtype_name(d)), d);
  for (const char* bad : {"f16", "BF16", "", "fp32", "bf16 "}) EXPECT_FALSE(parse_cache_dtype(bad)) << bad;
}

TEST(Capacity, ParsesByteSizes) {
  EXPECT_EQ(parse_bytes("36GiB"), 38654705664);
  EXPECT_EQ(parse_bytes("512MiB"), 536870912);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000);
  EXPECT_EQ(parse_bytes("1000"), 1000);
  EXPECT_EQ(parse_bytes("lots"), -1);
  EXPECT_EQ(parse_bytes("3 parsecs"), -1);
}

TEST(Sampling, GreedyTopKOneAndMinPOneAllPickTheArgmax) {
  const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f};
  SamplingParams p;
  EXPECT_EQ(Sampler(p).sample(logits, {}), 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(Sampler(p).sample(logits, {}), 1);
  p.top_k = 0;
  p.min_p = 1.0f;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    EXPECT_EQ(Sampler(p).sample(logits, {}), 1);
  }
}

TEST(Sampling, SeedReproducesAndTopPRestrictsTheCandidates) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[size_t(i)] = float(i % 10) * 0.3f;
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 123;
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 50; ++i) sa.push_back(a.sample(logits, {})), sb.push_back(b.sample(logits, {}));
  EXPECT_EQ(sa, sb);
  p.top_p = 0.05f;  // the ten tokens with logit 2.7 hold ~21% of the mass: only they survive
  Sampler c(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(c.sample(logits, {}) % 10, 9);
}

TEST(Sampling, PresencePenaltyAndVocabLimitSteerGreedy) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.5f, 9.0f};
  SamplingParams p;
  p.presence_penalty = 1.0f;
  const std::vector<int32_t> seen = {1};
  p.vocab_limit = 3;  // id 3 is padding
  EXPECT_EQ(Sampler(p).sample(logits, seen), 2);
  p.presence_penalty = 0.0f;
  EXPECT_EQ(Sampler(p).sample(logits, seen), 1);
}

}  // namespace
}  // namespace kiln::engine
