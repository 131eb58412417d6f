// The speed bench (issue 9's `kiln engine bench`) as a report: the figures and JSON keys the issue
// names, consistent with each other, and the options it is given reaching the engine (a bf16
// cache halves the KV and conv bytes read per token). It asserts content, never a speed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/speed_bench.h"
#include "test_models.h"

namespace kiln::engine {
namespace {

SpeedBenchOptions small_bench(const std::string& dir, CacheDtype cache) {
  SpeedBenchOptions o;
  o.model_dir = dir;
  o.threads = 2;
  o.cache_dtype = cache;
  o.prompt_tokens = 20;
  o.gen_tokens = 6;
  o.runs = 3;
  o.bandwidth_buffer_bytes = size_t{8} << 20;
  return o;
}

TEST(SpeedBench, ReportsTheIssueFiguresAndHonoursTheCacheDtype) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 256;
  const std::string dir = testing::make_model(tiny);
  auto f32 = run_speed_bench(small_bench(dir, CacheDtype::f32));
  ASSERT_TRUE(f32) << f32.error();
  auto bf16 = run_speed_bench(small_bench(dir, CacheDtype::bf16));
  ASSERT_TRUE(bf16) << bf16.error();

  for (const SpeedBenchReport* r : {&*f32, &*bf16}) {
    EXPECT_EQ(r->weights, "q8");  // the serving default
    EXPECT_EQ(r->threads, 2);
    EXPECT_GT(r->prefill_tok_s, 0);
    EXPECT_GT(r->decode_tok_s, 0);
    EXPECT_EQ(r->decode_runs_tok_s.size(), 3u);
    EXPECT_EQ(r->bytes_per_token, r->weight_bytes_per_token + r->state_bytes_per_token);
    EXPECT_NEAR(r->achieved_gb_s, double(r->bytes_per_token) * r->decode_tok_s / 1e9,
                1e-9 * r->achieved_gb_s);
    EXPECT_GT(r->measured_gb_s, 0);
    const auto j = nlohmann::json::parse(r->to_json());
    for (const char* key : {"prefill_tok_s", "decode_tok_s", "bytes_per_token", "achieved_gb_s",
                            "measured_gb_s", "cache_dtype"})
      EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(f32->cache_dtype, "f32");
  EXPECT_EQ(bf16->cache_dtype, "bf16");
  EXPECT_EQ(bf16->weight_bytes_per_token, f32->weight_bytes_per_token);
  // What a bf16 cache saves per decoded token: half of the conv windows (K−1 inputs of every
  // linear layer's conv channels) and half of the K and V rows of the full layers up to the mean
  // decode position. The recurrent states stay f32.
  const int linear = tiny.layers - tiny.layers / tiny.full_attention_interval, full = tiny.layers - linear;
  const int64_t conv_channels = 2 * int64_t(tiny.linear_key_heads) * tiny.linear_key_head_dim +
                                int64_t(tiny.linear_value_heads) * tiny.linear_value_head_dim;
  const int64_t positions = 20 + 6 / 2, kv_row = int64_t(tiny.kv_heads) * tiny.head_dim;
  const uint64_t saved =
      uint64_t(linear * (tiny.conv_kernel - 1) * conv_channels * 2 + full * positions * 2 * kv_row * 2);
  EXPECT_EQ(f32->state_bytes_per_token - bf16->state_bytes_per_token, saved);
  EXPECT_NE(bf16->to_table().find("| q8 | bf16 | 2 |"), std::string::npos) << bf16->to_table();
}

// --draft-tokens N adds the verification cost rows: k = 0..N, row 0 the plain decode step, and
// with a MoE each draft token routed on its own reads more experts (random ids: never fewer).
TEST(SpeedBench, VerificationCostRowsForEachDraftLength) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 256;
  tiny.experts = 16, tiny.top_k = 2;
  const std::string dir = testing::make_model(tiny);
  SpeedBenchOptions o = small_bench(dir, CacheDtype::f32);
  o.runs = 1;
  o.draft_tokens = 3;
  auto r = run_speed_bench(o);
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->verify.size(), 4u);
  for (int k = 0; k <= 3; ++k) {
    EXPECT_EQ(r->verify[size_t(k)].draft_tokens, k);
    EXPECT_GT(r->verify[size_t(k)].step_ms, 0);
  }
  EXPECT_DOUBLE_EQ(r->verify[0].vs_decode, 1.0);
  EXPECT_DOUBLE_EQ(r->verify[0].experts_per_layer, 2.0);  // one token: exactly top-k
  EXPECT_GT(r->verify[3].experts_per_layer, 2.0);
  EXPECT_LE(r->verify[3].experts_per_layer, 8.0);  // 4 tokens × top-2
  const auto j = nlohmann::json::parse(r->to_json());
  ASSERT_TRUE(j.contains("verify"));
  EXPECT_EQ(j["verify"].size(), 4u);
  EXPECT_NE(r->to_table().find("break-even accepted per step"), std::string::npos);
  // Without the option: no rows, no key.
  o.draft_tokens = 0;
  auto plain = run_speed_bench(o);
  ASSERT_TRUE(plain) << plain.error();
  EXPECT_TRUE(plain->verify.empty());
  EXPECT_FALSE(nlohmann::json::parse(plain->to_json()).contains("verify"));
}

}  // namespace
}  // namespace kiln::engine
