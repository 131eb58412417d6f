// Token sampling from f32 logits: greedy (temperature 0), temperature, top-k, top-p, min-p,
// presence penalty, with a seeded generator (same seed + same logits → same tokens).
// A Sampler is owned by one thread (it holds the generator state).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kiln::engine {

struct SamplingParams {
  float temperature = 0.0f;       // 0: greedy (argmax)
  int top_k = 0;                  // 0: off
  float top_p = 1.0f;             // 1: off
  float min_p = 0.0f;             // 0: off; keeps tokens with p ≥ min_p · p_max
  float presence_penalty = 0.0f;  // subtracted once from the logit of every token already generated
  uint64_t seed = 0;
  int64_t vocab_limit = 0;        // > 0: ids ≥ vocab_limit (embedding padding) are never sampled
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : p_(params), rng_(params.seed) {}
  // `seen`: tokens the presence penalty applies to (the ones generated so far).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> seen);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
};

}  // namespace kiln::engine
