// The double-precision matrix product behind the chunked delta rule: fast (AVX2 4×8 tiles with
// column and row tails) vs the plain reference, for accumulate and overwrite modes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/gemm_f64.h"

namespace kiln::engine::cpu {
namespace {

// Same products, FMA vs separate multiply-add and a different summation order: ~k ulps.
constexpr double kFastVsRefRel = 1e-13;

TEST(KernelGemmF64, FastMatchesReferenceIncludingTails) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0, 1);
  struct Case { int m, n, k; double alpha, beta; };
  const Case cases[] = {{1, 1, 1, 1, 0},      {3, 5, 7, -1, 1},      {4, 8, 128, 1, 0}, {64, 128, 128, -1, 1},
                        {63, 63, 128, 1, 0},   {128, 128, 64, 1, 0.9}, {5, 17, 3, 2, 0.5}, {65, 9, 1, 1, 1}};
  for (const Case& c : cases) {
    std::vector<double> A(size_t(c.m) * c.k), B(size_t(c.k) * c.n), C0(size_t(c.m) * c.n);
    for (auto& v : A) v = nd(rng);
    for (auto& v : B) v = nd(rng);
    for (auto& v : C0) v = nd(rng);
    auto want = C0, got = C0;
    gemm_f64_ref(c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, want.data(), c.n);
    gemm_f64(c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, got.data(), c.n);
    int bad = 0;
    for (size_t i = 0; i < want.size() && bad < 10; ++i)
      if (!(std::fabs(got[i] - want[i]) <= kFastVsRefRel * std::sqrt(double(c.k)) * (1 + std::fabs(want[i])) * 10)) {
        ADD_FAILURE() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " at " << i << ": " << got[i] << " vs " << want[i];
        ++bad;
      }
  }
}

}  // namespace
}  // namespace kiln::engine::cpu
