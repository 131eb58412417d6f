// The small matrix products behind the chunked delta rule: every SIMD path the CPU has (AVX2 6-row,
// AVX-512 8-row tiles with column and row tails) vs the plain reference, in double and float, for
// accumulate and overwrite modes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/gemm_small.h"

namespace kiln::engine::cpu {
namespace {

// Same products, FMA vs separate multiply-add and a different summation order: ~k ulps.
constexpr double kFastVsRefRel = 1e-13;

std::vector<GemmPath> fast_paths() {
  std::vector<GemmPath> paths;
  for (GemmPath p : {GemmPath::avx2, GemmPath::avx512})
    if (gemm_path_available(p)) paths.push_back(p);
  return paths;
}
const char* name(GemmPath p) {
  return p == GemmPath::avx512 ? "avx512" : p == GemmPath::avx2 ? "avx2" : "ref";
}

TEST(KernelGemmF64, FastMatchesReferenceIncludingTails) {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0, 1);
  struct Case {
    int m, n, k;
    double alpha, beta;
  };
  const Case cases[] = {{1, 1, 1, 1, 0},       {3, 5, 7, -1, 1},    {4, 8, 128, 1, 0},
                        {64, 128, 128, -1, 1}, {63, 63, 128, 1, 0}, {128, 128, 64, 1, 0.9},
                        {5, 17, 3, 2, 0.5},    {65, 9, 1, 1, 1}};
  for (const GemmPath path : fast_paths())
    for (const Case& c : cases) {
      std::vector<double> A(size_t(c.m) * c.k), B(size_t(c.k) * c.n), C0(size_t(c.m) * c.n);
      for (auto& v : A) v = nd(rng);
      for (auto& v : B) v = nd(rng);
      for (auto& v : C0) v = nd(rng);
      auto want = C0, got = C0;
      gemm_f64_ref(c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, want.data(), c.n);
      gemm_f64_on(path, c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, got.data(), c.n);
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 10; ++i)
        if (!(std::fabs(got[i] - want[i]) <=
              kFastVsRefRel * std::sqrt(double(c.k)) * (1 + std::fabs(want[i])) * 10)) {
          ADD_FAILURE() << name(path) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " at " << i << ": "
                        << got[i] << " vs " << want[i];
          ++bad;
        }
    }
}

// Float: the same tiles at 8 lanes (slabs of 16 columns). FMA against separate multiply-add and a
// different order of the alpha/beta steps: a few ulps of the sum of |terms|.
TEST(KernelGemmF32, FastMatchesReferenceIncludingTails) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  struct Case {
    int m, n, k;
    float alpha, beta;
  };
  const Case cases[] = {{1, 1, 1, 1, 0},       {3, 5, 7, -1, 1},    {4, 16, 128, 1, 0},
                        {64, 128, 128, -1, 1}, {63, 63, 128, 1, 0}, {128, 128, 64, 1, 0.9f},
                        {5, 17, 3, 2, 0.5f},   {65, 33, 1, 1, 1}};
  for (const GemmPath path : fast_paths())
    for (const Case& c : cases) {
      std::vector<float> A(size_t(c.m) * c.k), B(size_t(c.k) * c.n), C0(size_t(c.m) * c.n);
      for (auto& v : A) v = nd(rng);
      for (auto& v : B) v = nd(rng);
      for (auto& v : C0) v = nd(rng);
      auto want = C0, got = C0;
      gemm_f32_ref(c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, want.data(), c.n);
      gemm_f32_on(path, c.m, c.n, c.k, c.alpha, A.data(), c.k, B.data(), c.n, c.beta, got.data(), c.n);
      int bad = 0;
      for (int i = 0; i < c.m && bad < 10; ++i)
        for (int j = 0; j < c.n && bad < 10; ++j) {
          double magnitude = std::fabs(double(c.beta) * C0[size_t(i * c.n + j)]);  // Σ|terms| of this entry
          for (int p = 0; p < c.k; ++p)
            magnitude += std::fabs(double(c.alpha) * A[size_t(i * c.k + p)] * B[size_t(p * c.n + j)]);
          const double err = std::fabs(double(got[size_t(i * c.n + j)]) - want[size_t(i * c.n + j)]);
          if (!(err <= 4 * 1.2e-7 * std::sqrt(double(c.k)) * magnitude + 1e-30)) {
            ADD_FAILURE() << name(path) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " at " << i << ","
                          << j << ": " << got[size_t(i * c.n + j)] << " vs " << want[size_t(i * c.n + j)];
            ++bad;
          }
        }
    }
}

// The triangle shapes skip only terms that are zero (lower_a) or entries that are unused
// (lower_c): what they compute is bit for bit the full product's.
TEST(KernelGemmF64, TriangleShapesEqualTheFullProductWhereDefined) {
  std::mt19937 rng(4);
  std::normal_distribution<double> nd(0, 1);
  for (const GemmPath path : fast_paths())
    for (const int m : {1, 5, 8, 13, 64})
      for (const int n : {3, 8, 17, 128}) {
        const int k = m;  // lower_a: A is m × m lower triangular
        std::vector<double> A(size_t(m) * k), B(size_t(k) * n), C0(size_t(m) * n);
        for (int i = 0; i < m; ++i)
          for (int p = 0; p < k; ++p) A[size_t(i * k + p)] = p <= i ? nd(rng) : 0.0;
        for (auto& v : B) v = nd(rng);
        for (auto& v : C0) v = nd(rng);
        auto full = C0, tri = C0;
        gemm_f64_on(path, m, n, k, -1.0, A.data(), k, B.data(), n, 1.0, full.data(), n);
        gemm_f64_on(path, m, n, k, -1.0, A.data(), k, B.data(), n, 1.0, tri.data(), n, Triangle::lower_a);
        EXPECT_EQ(tri, full) << name(path) << " lower_a m=" << m << " n=" << n;

        // lower_c: a square product, compared on and below the diagonal only.
        std::vector<double> X(size_t(m) * 7), Y(size_t(7) * m), Cf(size_t(m) * m, 0.0),
            Cl(size_t(m) * m, 0.0);
        for (auto& v : X) v = nd(rng);
        for (auto& v : Y) v = nd(rng);
        gemm_f64_on(path, m, m, 7, 1.0, X.data(), 7, Y.data(), m, 0.0, Cf.data(), m);
        gemm_f64_on(path, m, m, 7, 1.0, X.data(), 7, Y.data(), m, 0.0, Cl.data(), m, Triangle::lower_c);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j <= i; ++j)
            ASSERT_EQ(Cl[size_t(i * m + j)], Cf[size_t(i * m + j)])
                << name(path) << " lower_c m=" << m << " " << i << "," << j;
      }
}

}  // namespace
}  // namespace kiln::engine::cpu
