// Matrix-product kernels: every SIMD table vs the scalar reference (same math, different
// summation order), row ranges that split a product like a thread pool would, and the accuracy
// of each quantized product against the exact f32 product on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/matmul.h"
#include "test_math.h"

namespace kiln::engine::cpu {
namespace {

using testing::rel_l2;

// Fast vs reference, float formats: only the float accumulation order differs (8-lane partial
// sums, then a horizontal add), which moves a sum of K products by ~K·2^-24 relative.
// q8/q4 share one definition of the arithmetic (matmul_ref.cpp), so they must match exactly.
constexpr double kFastVsRefRel = 2e-5;
// Quantized product vs exact f32 product, relative L2 over the output. For random weights the
// product's error equals the weights' rms rounding error (see quant_fns_test.cpp):
//   q8, uniform weights: step = amax/127 ≈ a/127 against σ = a/√3 → 0.38%: issue 9's 0.5% holds.
//   q8, Gaussian weights: 0.55% — above issue 9's 0.5%, and the floor of any 8-bit format
//       with one scale per 32 weights (ggml's Q8_0 is the same); bound 0.6%.
//   q4: issue 9 asks 3%, below the rate-distortion bound of any 4-bit code on Gaussian data
//       (6.25%); scale+offset blocks of 32 give ≈ 7.9% (Gaussian), ≈ 6.7% (uniform); bound 9%.
constexpr double kQ8UniformProductRel = 0.005;
constexpr double kQ8GaussianProductRel = 0.006;
constexpr double kQ4ProductRel = 0.090;
// bf16 weights with f32 activations: rms rounding ≈ 0.16% per weight.
constexpr double kBf16ProductRel = 0.0020;

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Stored {
  std::vector<uint8_t> bytes;
  WeightMatrix view;
};

Stored store(WeightFormat f, const std::vector<float>& w, int64_t rows, int64_t cols) {
  Stored s;
  s.bytes.resize(rows * row_bytes(f, cols));
  quantize_matrix(kernels_ref(), f, w.data(), rows, cols, s.bytes.data());
  s.view = WeightMatrix{f, rows, cols, s.bytes.data()};
  return s;
}

// Exact product in double: y[t, r] = Σ_k w[r, k] x[t, k].
std::vector<float> exact(const std::vector<float>& w, const std::vector<float>& x, int64_t rows,
                         int64_t cols, int64_t n) {
  std::vector<float> y(n * rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += double(w[r * cols + k]) * x[t * cols + k];
      y[t * rows + r] = float(s);
    }
  return y;
}


struct Shape {
  int64_t rows, cols, n;
};

std::string describe(const KernelTable& kt, WeightFormat f, const Shape& s) {
  return std::string(kt.name) + " " + weight_format_name(f) + " rows=" + std::to_string(s.rows) +
         " cols=" + std::to_string(s.cols) + " n=" + std::to_string(s.n);
}

// Compares kt against the reference; prints the first mismatches (at most ten) and fails.
void expect_matches_ref(const KernelTable& kt, WeightFormat f, const Shape& s, uint32_t seed) {
  const auto w = gaussian(s.rows * s.cols, seed);
  const auto x = gaussian(s.n * s.cols, seed + 1);
  const Stored st = store(f, w, s.rows, s.cols);
  ActQ16Buffer buf_ref, buf_fast;
  std::vector<float> want(s.n * s.rows), got(s.n * s.rows, NAN);
  matmul(kernels_ref(), st.view, x.data(), s.n, want.data(), s.rows, buf_ref);
  // Split the rows in three uneven ranges, as three threads would.
  const MatmulInput in = prepare_input(kt, f, x.data(), s.n, s.cols, buf_fast);
  const int64_t cut1 = s.rows / 3, cut2 = (2 * s.rows) / 3 + 1 < s.rows ? (2 * s.rows) / 3 + 1 : s.rows;
  kt.matmul[int(f)](st.view, in, got.data(), s.rows, 0, cut1);
  kt.matmul[int(f)](st.view, in, got.data(), s.rows, cut1, cut2);
  kt.matmul[int(f)](st.view, in, got.data(), s.rows, cut2, s.rows);
  double norm = 0;
  for (float v : want) norm = std::max(norm, double(std::fabs(v)));
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 10; ++i) {
    const double tol = is_block_format(f)
                           ? 0.0
                           : kFastVsRefRel * (norm + std::fabs(want[i])) * std::sqrt(double(s.cols) / 64);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << describe(kt, f, s) << ": y[t=" << i / s.rows << ", r=" << i % s.rows
                    << "] = " << got[i] << ", reference " << want[i];
      ++bad;
    }
  }
}

// Streaming tiles take 1-4 tokens a pass over R rows (R = 1, 4, 3, 2): the shapes give each token count
// whole groups of eight blocks, a trailing part (288 = 9 blocks, 800 = 25) and rows left over.
const Shape kShapes[] = {
    {1, 32, 1},   {5, 64, 1},     {37, 96, 1},  {64, 1024, 1}, {7, 288, 3},
    {2, 32, 4},   {9, 256, 5},    {33, 512, 70}, {64, 1024, 9}, {3, 2048, 130},
    {7, 800, 2},  {11, 288, 4},   {10, 512, 3},  {13, 800, 6},  {19, 288, 8},
    {21, 288, 23}, {35, 512, 14}, {16, 96, 12}, {18, 800, 31}, {7, 288, 32}, {5, 96, 33},
};

TEST(KernelMatmul, FastTablesMatchReferenceForEveryFormatAndShape) {
  std::vector<const KernelTable*> tables;
  if (kernels_avx2()) tables.push_back(kernels_avx2());
  if (kernels_avx512()) tables.push_back(kernels_avx512());
  uint32_t seed = 100;
  for (const KernelTable* kt : tables)
    for (int f = 0; f < kWeightFormatCount; ++f)
      for (const Shape& s : kShapes) expect_matches_ref(*kt, WeightFormat(f), s, seed++);
}

// A token's q8/q4 outputs are bitwise the same whether it is multiplied alone (the decode
// kernel) or with other tokens (the panel kernel, every tile width and tail): what lets a
// session's logits be identical alone and batched.
TEST(KernelMatmul, QuantizedOutputsDoNotDependOnTheTokensSharingTheCall) {
  std::vector<const KernelTable*> tables = {&kernels_ref()};
  if (kernels_avx2()) tables.push_back(kernels_avx2());
  if (kernels_avx512()) tables.push_back(kernels_avx512());
  for (const KernelTable* kt : tables)
    for (WeightFormat f : {WeightFormat::q8, WeightFormat::q4})
      // 2 and 4 tokens stream; 5, 7 and 8 stream in two passes; more use panels (tiles of 4
      // tokens on AVX2, 8 on AVX-512, and every tail width), except on AVX-512 where q8 streams in
      // passes up to 32 tokens and q4 up to 16.
      for (const Shape& s : {Shape{45, 288, 7}, Shape{16, 256, 4}, Shape{21, 1024, 11}, Shape{3, 64, 2}, Shape{37, 96, 5},
                             Shape{33, 128, 8}, Shape{18, 64, 9}, Shape{29, 512, 23}, Shape{17, 288, 14},
                             Shape{19, 288, 16}, Shape{23, 96, 17}, Shape{13, 288, 32}, Shape{9, 64, 33}}) {
        const auto w = gaussian(s.rows * s.cols, 11);
        const auto x = gaussian(s.n * s.cols, 12);
        const Stored st = store(f, w, s.rows, s.cols);
        ActQ16Buffer buf;
        std::vector<float> together(s.n * s.rows), alone(s.rows);
        matmul(*kt, st.view, x.data(), s.n, together.data(), s.rows, buf);
        for (int64_t t = 0; t < s.n; ++t) {
          matmul(*kt, st.view, x.data() + t * s.cols, 1, alone.data(), s.rows, buf);
          for (int64_t r = 0; r < s.rows; ++r)
            ASSERT_EQ(together[t * s.rows + r], alone[r]) << describe(*kt, f, s) << " t=" << t << " r=" << r;
        }
      }
}

TEST(KernelMatmul, FloatFormatsHandleColumnsNotMultipleOfEight) {
  std::vector<const KernelTable*> tables;
  if (kernels_avx2()) tables.push_back(kernels_avx2());
  for (const KernelTable* kt : tables)
    for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16})
      for (const Shape& s : {Shape{3, 13, 1}, Shape{5, 45, 6}}) expect_matches_ref(*kt, f, s, 7);
}

TEST(KernelMatmul, BestTableIsTheFastestTheCpuSupports) {
  const KernelTable& best = kernels_best();
  if (kernels_avx512()) {
    EXPECT_STREQ(best.name, "avx512");
  } else if (kernels_avx2()) {
    EXPECT_STREQ(best.name, "avx2");
  } else {
    EXPECT_STREQ(best.name, "ref");
  }
}

struct AccuracyCase {
  WeightFormat format;
  bool uniform_weights;
  double bound;
};

class QuantizedProductAccuracy : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(QuantizedProductAccuracy, WithinBoundOfExactProduct) {
  const auto [format, uniform_weights, bound] = GetParam();
  const int64_t rows = 256, cols = 1024, n = 6;
  const auto w = uniform_weights ? uniform(rows * cols, 41) : gaussian(rows * cols, 41);
  const auto x = gaussian(n * cols, 42);
  const auto want = exact(w, x, rows, cols, n);
  const Stored st = store(format, w, rows, cols);
  ActQ16Buffer buf;
  std::vector<float> got(n * rows);
  matmul(kernels_best(), st.view, x.data(), n, got.data(), rows, buf);
  const double err = rel_l2(got, want);
  const char* dist = uniform_weights ? "uniform" : "gaussian";
  EXPECT_LT(err, bound) << weight_format_name(format) << " " << dist;
  std::printf("[ info ] %s product, %s weights: rel L2 vs exact f32 = %.5f (bound %.4f)\n",
              weight_format_name(format), dist, err, bound);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantizedProductAccuracy,
    ::testing::Values(AccuracyCase{WeightFormat::q8, true, kQ8UniformProductRel},
                      AccuracyCase{WeightFormat::q8, false, kQ8GaussianProductRel},
                      AccuracyCase{WeightFormat::q4, true, kQ4ProductRel},
                      AccuracyCase{WeightFormat::q4, false, kQ4ProductRel},
                      AccuracyCase{WeightFormat::bf16, false, kBf16ProductRel},
                      // f32 weights: only the float summation order differs from the exact sum.
                      AccuracyCase{WeightFormat::f32, false, 1e-6}));

}  // namespace
}  // namespace kiln::engine::cpu
