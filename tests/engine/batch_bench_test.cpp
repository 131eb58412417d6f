// The batching bench (issue 10's `kiln engine bench --sessions`) as a report: one row per
// concurrency with the figures the issue names, the median of several decode rounds, and the
// fairness check's fields. What it asserts is the report's content and consistency, never a
// speed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/batch_bench.h"
#include "test_models.h"

namespace kiln::engine {
namespace {

// A tiny model with room for the fairness prompt, and the bench's options on it.
BatchBenchOptions options_on_tiny_model(const TinyModelOptions& tiny) {
  BatchBenchOptions o;
  o.model_dir = testing::make_model(tiny);
  o.threads = 2;
  o.prefill_chunk = 16;
  o.fairness_prompt_tokens = 40;
  return o;
}

TEST(BatchBench, ReportsEveryConcurrencyWithMedianRoundsAndFairness) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 512;
  BatchBenchOptions o = options_on_tiny_model(tiny);
  o.sessions = {1, 2, 3};
  o.prompt_tokens = 12;
  o.gen_tokens = 4;
  o.runs = 3;
  o.fairness_decoders = 2;
  o.cache_dtype = CacheDtype::bf16;  // passed through to the engine, and named in the report
  auto r = run_batch_bench(o);
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->rows.size(), 3u);
  EXPECT_EQ(r->runs, 3);
  for (size_t i = 0; i < r->rows.size(); ++i) {
    const BatchBenchRow& row = r->rows[i];
    EXPECT_EQ(row.n, o.sessions[i]);
    EXPECT_GT(row.aggregate_tok_s, 0);
    EXPECT_GT(row.per_session_tok_s, 0);
    EXPECT_GT(row.step_ms, 0);
    EXPECT_GT(row.prefill_tok_s, 0);
    // Each of the n sessions routes each token to top_k experts: between top_k and
    // min(experts, n·top_k) distinct experts per layer per step.
    EXPECT_GE(row.experts_per_layer, tiny.top_k - 1e-9);
    EXPECT_LE(row.experts_per_layer, std::min(tiny.experts, row.n * tiny.top_k) + 1e-9);
    // The bytes bound: a batch shares the weights (never more than n tokens' worth, never less
    // than one token's), so it lies between 1 and n; alone, a step reads exactly one token's bytes.
    EXPECT_GT(row.bytes_per_step, 0u);
    EXPECT_GE(row.bytes_bound_x, 1.0 - 1e-9);
    EXPECT_LE(row.bytes_bound_x, row.n + 1e-9);
    if (row.n == 1) {
      EXPECT_NEAR(row.bytes_bound_x, 1.0, 1e-9);
    } else {
      EXPECT_GT(row.bytes_bound_x, 1.0);  // the non-expert weights, at least, are shared
    }
    EXPECT_GT(row.achieved_gb_s, 0);
    // More sessions read more: their states, and at least as many experts.
    if (i > 0) {
      EXPECT_GT(row.bytes_per_step, r->rows[i - 1].bytes_per_step);
    }
  }
  ASSERT_TRUE(r->fairness.has_value());
  EXPECT_EQ(r->fairness->prompt_tokens, 40);
  EXPECT_EQ(r->fairness->chunk_tokens, 16);
  EXPECT_GT(r->fairness->chunk_alone_ms, 0);
  // 40 tokens in chunks of 16: 16, 16, 8, cut the same way with and without the decoders (their
  // tokens do not count against the chunk), so the chunk-by-chunk comparison is made.
  EXPECT_EQ(r->fairness->chunks, 3);
  EXPECT_TRUE(r->fairness->same_cut);

  const auto j = nlohmann::json::parse(r->to_json());
  EXPECT_EQ(j.at("runs"), 3);
  EXPECT_EQ(r->cache_dtype, "bf16");
  EXPECT_EQ(j.at("cache_dtype"), "bf16");
  ASSERT_EQ(j.at("sessions").size(), 3u);
  for (const char* key : {"n", "aggregate_tok_s", "per_session_tok_s", "step_ms", "experts_per_layer", "bytes_per_step",
                          "achieved_gb_s", "bytes_bound_x"})
    EXPECT_TRUE(j.at("sessions")[0].contains(key)) << key;
  EXPECT_EQ(j.at("fairness").at("chunks"), 3);
  EXPECT_EQ(j.at("fairness").at("same_cut"), true);
  EXPECT_TRUE(j.at("fairness").contains("worst_extra_ms"));
  EXPECT_TRUE(j.at("fairness").contains("mean_extra_ms"));
  EXPECT_LE(r->fairness->mean_extra_ms, r->fairness->worst_extra_ms + 1e-9);
  EXPECT_NE(r->to_table("cmd").find("median of 3 rounds"), std::string::npos);
}

// --fairness-decoders 0: the same prefill twice with nothing decoding, a control for how much
// the machine drifts between the two runs. No decode step precedes it, and it is cut the same.
TEST(BatchBench, FairnessWithoutDecodersRunsThePrefillTwiceAsAControl) {
  TinyModelOptions tiny;
  tiny.max_position_embeddings = 512;
  BatchBenchOptions o = options_on_tiny_model(tiny);
  o.sessions = {1};
  o.prompt_tokens = 8;
  o.gen_tokens = 2;
  o.fairness_decoders = 0;
  auto r = run_batch_bench(o);
  ASSERT_TRUE(r) << r.error();
  ASSERT_TRUE(r->fairness.has_value());
  EXPECT_EQ(r->fairness->decoders, 0);
  EXPECT_EQ(r->fairness->worst_step_before_ms, 0);
  EXPECT_GT(r->fairness->worst_step_during_ms, 0);
  EXPECT_EQ(r->fairness->chunks, 3);
  EXPECT_TRUE(r->fairness->same_cut);

  o.fairness_decoders = -1;
  auto bad = run_batch_bench(o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("--fairness-decoders"), std::string::npos) << bad.error();
}

}  // namespace
}  // namespace kiln::engine
