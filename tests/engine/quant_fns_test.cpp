// Quantization functions (test-quantize-fns style): fast quantizers vs their _ref twins, bit for
// bit; round-trip error per format against named bounds; fp16/bf16 conversions against the
// compiler's own IEEE conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/matmul.h"
#include "engine/cpu/quant.h"
#include "test_math.h"

namespace kiln::engine::cpu {
namespace {

using testing::rel_l2;

// Round-trip relative L2 error bounds for N(0,1) data. A block of 32 normals has E max|x| ≈ 2.4σ
// (and range ≈ 4.1σ); uniform rounding error is step/√12:
//   q8: step = amax/127  → 2.4/127/√12 ≈ 0.55% of σ (any 8-bit grid with one scale per 32
//       weights lands here: Q8_0 of ggml is the same format)
//   q4: step = range/15  → 4.1/15/√12  ≈ 7.9% of σ  (4 bits cannot do much better: the
//       rate-distortion bound for a Gaussian at 4 bits/weight is 2^-4 = 6.25%)
// The bounds leave ~10% headroom over those estimates.
constexpr double kQ8RoundTripRel = 0.0060;
constexpr double kQ4RoundTripRel = 0.090;
// bf16 keeps 7 stored mantissa bits: at most half an ulp = 2^-8 relative per element, and
// rms ≈ 2^-7/√12 over the mantissa range ≈ 0.16%.
constexpr double kBf16RoundTripRel = 0.0020;

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}


// Rows that stress the quantizers: normal, all zero, constant, tiny, huge, one outlier.
std::vector<std::vector<float>> tricky_rows(int64_t cols) {
  std::vector<std::vector<float>> rows;
  rows.push_back(gaussian(cols, 1));
  rows.push_back(std::vector<float>(cols, 0.0f));
  rows.push_back(std::vector<float>(cols, -0.75f));
  // Small weights (fp16 scales stay normal down to max|w| ≈ 8e-3; below that the scale loses
  // precision as a subnormal, as in ggml — real and make-tiny weights sit well above it).
  rows.push_back(gaussian(cols, 2, 1e-2f));
  rows.push_back(gaussian(cols, 3, 3000.0f));
  auto outlier = gaussian(cols, 4);
  outlier[5] = 80.0f;
  rows.push_back(outlier);
  return rows;
}

TEST(Fp16, ScalarConversionMatchesCompilerFloat16) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f,
                               2.98e-8f, 6.1e-5f, INFINITY, -INFINITY};
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    u = (u & 0x87ffffffu) | ((0x60u + (u >> 27) % 0x30u) << 23);  // exponents around fp16's range
    float f;
    std::memcpy(&f, &u, 4);
    values.push_back(f);
  }
  for (float f : values) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(fp32_to_fp16(f), want) << "f=" << f;
    ASSERT_EQ(fp16_to_fp32(want), static_cast<float>(h)) << "h=" << want;
  }
}

TEST(Bf16, RoundTripWithinHalfUlp) {
  const auto x = gaussian(4096, 11);
  std::vector<uint8_t> row(row_bytes(WeightFormat::bf16, 4096));
  quantize_row_ref(WeightFormat::bf16, x.data(), row.data(), 4096);
  std::vector<float> back(4096);
  dequantize_row_ref(WeightFormat::bf16, row.data(), back.data(), 4096);
  EXPECT_LT(rel_l2(back, x), kBf16RoundTripRel);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(back[i] - x[i]), std::fabs(x[i]) / 256);
}

struct RoundTripCase {
  WeightFormat format;
  double bound;
};

class QuantRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(QuantRoundTrip, GaussianErrorWithinBound) {
  const auto [format, bound] = GetParam();
  const int64_t cols = 4096;
  const auto x = gaussian(cols * 8, 21);
  std::vector<uint8_t> q(row_bytes(format, cols));
  std::vector<float> back(x.size());
  for (int r = 0; r < 8; ++r) {
    quantize_row_ref(format, x.data() + r * cols, q.data(), cols);
    dequantize_row_ref(format, q.data(), back.data() + r * cols, cols);
  }
  const double err = rel_l2(back, x);
  EXPECT_LT(err, bound) << weight_format_name(format);
  EXPECT_GT(err, bound / 4) << "error suspiciously small: is the format really quantizing?";
}

TEST_P(QuantRoundTrip, TrickyRowsStayFiniteAndClose) {
  const auto [format, bound] = GetParam();
  const int64_t cols = 256;
  for (const auto& x : tricky_rows(cols)) {
    std::vector<uint8_t> q(row_bytes(format, cols));
    std::vector<float> back(cols);
    quantize_row_ref(format, x.data(), q.data(), cols);
    dequantize_row_ref(format, q.data(), back.data(), cols);
    double max_abs = 0;
    for (float v : x) max_abs = std::max(max_abs, double(std::fabs(v)));
    for (int64_t i = 0; i < cols; ++i) {
      ASSERT_TRUE(std::isfinite(back[i]));
      // Per element the error is at most half a step plus the fp16 rounding of the scale.
      ASSERT_LE(std::fabs(back[i] - x[i]), max_abs * (format == WeightFormat::q8 ? 0.005 : 0.07) + 1e-30)
          << weight_format_name(format) << " i=" << i << " x=" << x[i] << " got " << back[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantRoundTrip,
                         ::testing::Values(RoundTripCase{WeightFormat::q8, kQ8RoundTripRel},
                                           RoundTripCase{WeightFormat::q4, kQ4RoundTripRel}));

// Every SIMD table's quantizers produce exactly the reference bytes.
std::vector<const KernelTable*> fast_tables() {
  std::vector<const KernelTable*> t;
  if (kernels_avx2()) t.push_back(kernels_avx2());
  if (kernels_avx512()) t.push_back(kernels_avx512());
  return t;
}

TEST(QuantFast, RowQuantizersMatchReferenceBitForBit) {
  for (const KernelTable* kt : fast_tables())
    for (WeightFormat f : {WeightFormat::bf16, WeightFormat::q8, WeightFormat::q4})
      for (int64_t cols : {32, 96, 1024})
        for (const auto& x : tricky_rows(cols)) {
          std::vector<uint8_t> want(row_bytes(f, cols)), got(row_bytes(f, cols));
          quantize_row_ref(f, x.data(), want.data(), cols);
          kt->quantize[int(f)](x.data(), got.data(), cols);
          ASSERT_EQ(got, want) << kt->name << " " << weight_format_name(f) << " cols=" << cols;
        }
}

TEST(QuantFast, ActivationQuantizerMatchesReferenceBitForBit) {
  for (const KernelTable* kt : fast_tables())
    for (int64_t k : {32, 512, 2048})
      for (const auto& x : tricky_rows(k)) {
        std::vector<int16_t> qa(k), qb(k);
        std::vector<int32_t> sa(k / 32), sb(k / 32);
        float da = 0, db = 0;
        quantize_acts_ref(x.data(), k, qa.data(), sa.data(), &da);
        kt->quantize_acts(x.data(), k, qb.data(), sb.data(), &db);
        ASSERT_EQ(qa, qb) << kt->name << " k=" << k;
        ASSERT_EQ(sa, sb) << kt->name << " k=" << k;
        ASSERT_EQ(da, db);
      }
}

TEST(QuantActs, Int16ActivationErrorIsNegligible) {
  // One scale per token at 15 bits: error ≤ amax/65534 per element, far below any weight format.
  const auto x = gaussian(2048, 31);
  std::vector<int16_t> q(2048);
  std::vector<int32_t> s(64);
  float d = 0;
  quantize_acts_ref(x.data(), 2048, q.data(), s.data(), &d);
  std::vector<float> back(2048);
  for (int i = 0; i < 2048; ++i) back[i] = d * q[quant_slot(64, i / 32, i % 32)];
  EXPECT_LT(rel_l2(back, x), 1e-4);
  for (int b = 0; b < 64; ++b) {
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += q[quant_slot(64, b, j)];
    ASSERT_EQ(s[b], sum);
  }
}

TEST(QuantLayout, SlotsAndNibblesCoverEveryWeightOnce) {
  // Rows with only whole groups, only trailing blocks, and both.
  for (const int64_t nb : {1, 3, 8, 9, 16, 21}) {
    std::vector<int> slot_used(size_t(nb * 32)), nibble_used(size_t(nb * 32));
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t e = 0; e < 32; ++e) {
        const int64_t s = quant_slot(nb, b, e);
        ASSERT_GE(s, 0);
        ASSERT_LT(s, nb * 32);
        ++slot_used[size_t(s)];
        const Q4Place at = q4_place(nb, s);
        ASSERT_LT(at.byte, nb * 16);
        ++nibble_used[size_t(2 * at.byte + at.high)];
        // Whole groups interleave pairs of eight blocks; trailing blocks stay in order.
        if (b < nb / 8 * 8) {
          EXPECT_EQ(s, b / 8 * 256 + e / 2 * 16 + b % 8 * 2 + e % 2);
        } else {
          EXPECT_EQ(s, b * 32 + e);
        }
      }
    for (size_t i = 0; i < slot_used.size(); ++i) {
      ASSERT_EQ(slot_used[i], 1) << "nb " << nb << " slot " << i;
      ASSERT_EQ(nibble_used[i], 1) << "nb " << nb << " nibble " << i;
    }
  }
}

TEST(WeightFormatNames, WeightChoicesAreStoredOrAConversion) {
  const auto stored = parse_weight_choice("stored");
  ASSERT_TRUE(stored.has_value()) << "stored is a choice";
  EXPECT_FALSE(stored->has_value()) << "stored converts nothing";
  EXPECT_EQ(parse_weight_choice("q8"), std::optional<std::optional<WeightFormat>>(WeightFormat::q8));
  EXPECT_EQ(parse_weight_choice("q4"), std::optional<std::optional<WeightFormat>>(WeightFormat::q4));
  EXPECT_EQ(parse_weight_choice("bf16"), std::optional<std::optional<WeightFormat>>(WeightFormat::bf16));
  for (const char* bad : {"f32", "Q8", "", "stored ", "int8"}) EXPECT_FALSE(parse_weight_choice(bad)) << bad;
}

TEST(WeightFormatNames, ParseRoundTripsAndRejectsUnknown) {
  for (int i = 0; i < kWeightFormatCount; ++i) {
    const auto f = static_cast<WeightFormat>(i);
    EXPECT_EQ(parse_weight_format(weight_format_name(f)), f);
  }
  EXPECT_FALSE(parse_weight_format("q5").has_value());
  EXPECT_EQ(row_bytes(WeightFormat::q8, 1024), 1024u + 64u);
  EXPECT_EQ(row_bytes(WeightFormat::q4, 1024), 512u + 128u);
}

}  // namespace
}  // namespace kiln::engine::cpu
