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
// Quants are kept in *slot order* (quant_slot below): blocks go in groups of eight, and inside
// a group the two-weight pairs of its eight blocks interleave — pair p of block 8g+i sits at
// slot 256g + 16p + 2i — so one 16-weight load holds pair p of eight blocks, and an integer
// multiply-add of it leaves each block's partial sum in its own lane: a kernel never sums a
// vector horizontally. Blocks after the last full group keep natural order (slot 32b + e).
// q8 stores quant s at byte s. q4 packs two per byte, the low nibble of byte o of a span holding
// slot o and its high nibble slot o + half: spans are the 256-slot groups (half 128) and the
// single trailing blocks (half 16), so one 16-byte load unpacks to 32 slots in order.
// Activations (ActQ16) use the same slot order, so a dot product pairs equal slots.
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
// What users choose among (`--weights`, a model's "weights" in the server config): "stored" keeps
// the checkpoint's own dtype, exact; the others convert at load (engine/weights/quantized_weights.h).
inline constexpr std::string_view kWeightChoices[] = {"stored", "bf16", "q8", "q4"};
inline constexpr std::string_view kWeightChoicesText = "stored, bf16, q8 or q4";  // for messages
// nullopt: not a choice. Otherwise the format to convert to, itself nullopt for "stored".
std::optional<std::optional<WeightFormat>> parse_weight_choice(std::string_view name);
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

// Slot of weight e (0..31) of block b in a row of nb blocks (see above).
inline int64_t quant_slot(int64_t nb, int64_t b, int64_t e) {
  if (b >= (nb & ~int64_t{7})) return b * 32 + e;
  return (b >> 3) * 256 + (e >> 1) * 16 + (b & 7) * 2 + (e & 1);
}
// Where q4 keeps a slot: byte offset within the quants and which nibble.
struct Q4Place {
  int64_t byte;
  bool high;
};
inline Q4Place q4_place(int64_t nb, int64_t slot) {
  const int64_t grouped = (nb & ~int64_t{7}) * 32;
  const int64_t span = slot < grouped ? 256 : 32;
  const int64_t base = slot < grouped ? slot / 256 * 256 : grouped + (slot - grouped) / 32 * 32;
  const int64_t o = slot - base, half = span / 2;
  return {base / 2 + o % half, o >= half};
}
// The q4 value (0..15) at a slot of a row's quants q.
inline int q4_value(const uint8_t* q, int64_t nb, int64_t slot) {
  const Q4Place at = q4_place(nb, slot);
  return at.high ? q[at.byte] >> 4 : q[at.byte] & 0xf;
}
// Natural order (weight e of block b at 32b + e) → slot order, one row of nb blocks: the fast
// quantizers compute natural order and reorder with these (defined once, outside any SIMD code).
// natural and slots must not overlap.
void q8_to_slot_order(const int8_t* natural, int8_t* slots, int64_t nb);
void q16_to_slot_order(const int16_t* natural, int16_t* slots, int64_t nb);
// q4 nibble values (0..15, natural order) → the packed quants of one row.
void q4_pack(const uint8_t* natural_nibbles, uint8_t* q, int64_t nb);

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
// n tokens of k values in slot order: q[t*k + quant_slot(k/32, i/32, i%32)] = round(x_i/d[t])
// with d[t] = max|x_t| / 32767, and
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
