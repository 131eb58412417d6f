// Weight storage formats of the CPU backend and their plain reference quantizers.
//
// A weight matrix is `rows` × `cols` (out × in, the checkpoint's [out, in] order), stored row
// after row; every row has the same size, `row_bytes(format, cols)`, so a kernel can start at any
// row and a file cache can be memory-mapped as is. Within one row (cols must be a multiple of 32
// for the block formats):
//
//   f32   float    w[cols]
//   bf16  uint16_t w[cols]                                   (upper half of an f32)
//   q8    fp16 d[cols/32] | int8  q[cols]                    w = d·q          8.5 bits/weight
//   q4    fp16 d[cols/32] | fp16 m[cols/32] | uint8 q[cols/2] w = m + d·q      5.0 bits/weight
//
// q4 packs two weights per byte: byte j of block b holds weight 32b+j in its low nibble and
// weight 32b+16+j in its high nibble (so one 16-byte load unpacks to 32 weights in order).
// Scales come first and grouped so that eight of them convert with one instruction.
//
// Activations meeting quantized weights are quantized per token to int16 with one scale
// (ActQ16): its rounding error (~1e-5 relative) is negligible next to the weights', so a q8
// product is as exact as its weights (0.5%) — an int8 activation would double that error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace kiln::engine::cpu {

enum class WeightFormat : uint8_t { f32 = 0, bf16 = 1, q8 = 2, q4 = 3 };
inline constexpr int kWeightFormatCount = 4;
inline constexpr int64_t kQuantBlock = 32;  // weights per scale in q8 and q4

const char* weight_format_name(WeightFormat format);
std::optional<WeightFormat> parse_weight_format(std::string_view name);
bool is_block_format(WeightFormat format);  // q8, q4: cols must be a multiple of kQuantBlock
// Bytes of one stored row of `cols` weights (inline: kernels compute row addresses with it).
inline size_t row_bytes(WeightFormat format, int64_t cols) {
  const auto n = static_cast<size_t>(cols);
  switch (format) {
    case WeightFormat::f32: return 4 * n;
    case WeightFormat::bf16: return 2 * n;
    case WeightFormat::q8: return n + 2 * (n / kQuantBlock);
    case WeightFormat::q4: return n / 2 + 4 * (n / kQuantBlock);
  }
  return 0;
}

// --- scalar conversions (exact IEEE round-to-nearest-even, same results as F16C) -------------
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);
inline float bf16_to_fp32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even (NaN stays NaN)

// --- reference quantizers: plain loops, never optimized -------------------------------------
// Each converts `cols` floats into one stored row (`dst` holds row_bytes(format, cols)).
void quantize_row_q8_ref(const float* src, uint8_t* dst, int64_t cols);
void quantize_row_q4_ref(const float* src, uint8_t* dst, int64_t cols);
// Any format, reference: f32 and bf16 copy/convert.
void quantize_row_ref(WeightFormat format, const float* src, uint8_t* dst, int64_t cols);
// Back to floats: dst[cols].
void dequantize_row_ref(WeightFormat format, const uint8_t* src, float* dst, int64_t cols);

// --- activations for quantized weights ------------------------------------------------------
// n tokens of k values: q[t*k + i] = round(x/d[t]) with d[t] = max|x_t| / 32767, and
// block_sum[t*(k/32) + b] = Σ of the 32 q's of block b (the q4 offset term needs it).
struct ActQ16View {
  int64_t n = 0, k = 0;
  const int16_t* q = nullptr;
  const int32_t* block_sum = nullptr;
  const float* d = nullptr;
};

// Owns the activation buffers; reserve() once and reuse, so a decode loop allocates nothing.
class ActQ16Buffer {
 public:
  void reserve(int64_t n, int64_t k);
  // Writes through the given quantizer (reference or fast; both produce identical values).
  using QuantizeActsFn = void (*)(const float* x, int64_t k, int16_t* q, int32_t* block_sum,
                                  float* d);
  ActQ16View quantize(const float* x, int64_t n, int64_t k, QuantizeActsFn fn);

 private:
  std::vector<int16_t> q_;
  std::vector<int32_t> block_sum_;
  std::vector<float> d_;
};

// One token: reference activation quantizer (k a multiple of 32).
void quantize_acts_ref(const float* x, int64_t k, int16_t* q, int32_t* block_sum, float* d);

}  // namespace kiln::engine::cpu
