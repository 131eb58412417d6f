// Numeric helpers shared by the engine tests: relative L2 error, reproducible random tokens and
// Gaussian vectors.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kiln::engine::testing {

// ‖got − want‖₂ / ‖want‖₂, accumulated in double (0 when both are zero).
inline double rel_l2(const float* got, const float* want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_l2(got.data(), want.data(), int64_t(want.size()));
}

// n token ids in [0, vocab) from a 64-bit LCG: the same sequence for the same seed everywhere.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33) % int32_t(vocab);
  return t;
}

// n samples of N(0, scale²) drawn from g (the caller's generator: successive calls continue it).
inline std::vector<float> randn(size_t n, std::mt19937_64& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace kiln::engine::testing
