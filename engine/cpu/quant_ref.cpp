// Reference quantizers and conversions: plain loops, kept obviously correct. The fast versions in
// quant_avx2.cpp must reproduce them bit for bit (tests/engine/quant_fns_test.cpp).
#include "engine/cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kiln::engine::cpu {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::q8: return "q8";
    case WeightFormat::q4: return "q4";
  }
  return "?";
}

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  for (int i = 0; i < kWeightFormatCount; ++i) {
    auto f = static_cast<WeightFormat>(i);
    if (name == weight_format_name(f)) return f;
  }
  return std::nullopt;
}

std::optional<std::optional<WeightFormat>> parse_weight_choice(std::string_view name) {
  for (std::string_view choice : kWeightChoices)
    if (name == choice) return name == "stored" ? std::optional<WeightFormat>() : parse_weight_format(name);
  return std::nullopt;
}

bool is_block_format(WeightFormat format) {
  return format == WeightFormat::q8 || format == WeightFormat::q4;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 with round-to-nearest-even, overflow to inf, subnormals (what F16C does).
uint16_t fp32_to_fp16(float f) {
  const uint32_t x = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN / inf
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    const float scaled = float_of(ax) * 16777216.0f;  // exact: power-of-two scaling
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: re-bias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t mant = ax + 0xc8000000u;  // exponent - 112 (127 - 15) in the exponent field
  const uint32_t round = 0xfffu + ((mant >> 13) & 1u);
  mant += round;
  return sign | static_cast<uint16_t>(mant >> 13);
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return float_of(bits_of(v) | sign);
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

void quantize_row_q8_ref(const float* src, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  auto* d = reinterpret_cast<uint16_t*>(dst);
  auto* q = reinterpret_cast<int8_t*>(dst + 2 * nb);
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQuantBlock;
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    // Quantize with the scale as stored (fp16), so rounding of the scale is not an extra error.
    const uint16_t d16 = fp32_to_fp16(amax / 127.0f);
    const float dd = fp16_to_fp32(d16);
    const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    d[b] = d16;
    for (int j = 0; j < kQuantBlock; ++j) {
      const float v = std::nearbyint(x[j] * id);
      q[quant_slot(nb, b, j)] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

void quantize_row_q4_ref(const float* src, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  auto* d = reinterpret_cast<uint16_t*>(dst);
  auto* m = d + nb;
  uint8_t* q = dst + 4 * nb;
  std::vector<uint8_t> nib(static_cast<size_t>(cols));
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQuantBlock;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQuantBlock; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    const uint16_t d16 = fp32_to_fp16((hi - lo) / 15.0f);
    const uint16_t m16 = fp32_to_fp16(lo);
    const float dd = fp16_to_fp32(d16), mm = fp16_to_fp32(m16);
    const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    d[b] = d16;
    m[b] = m16;
    for (int j = 0; j < kQuantBlock; ++j) {
      const float v = std::nearbyint((x[j] - mm) * id);
      nib[size_t(b * kQuantBlock + j)] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
    }
  }
  q4_pack(nib.data(), q, nb);
}

namespace {
// Pairs (two consecutive quants of a block: kPairBytes bytes) moved straight from natural order
// to slot order; memcpy because a row's pairs need not be aligned. natural and slots are distinct.
template <size_t kPairBytes>
void pairs_to_slot_order(const void* natural, void* slots, int64_t nb) {
  const auto* in = static_cast<const uint8_t*>(natural);
  auto* out = static_cast<uint8_t*>(slots);
  const int64_t full = nb & ~int64_t{7};
  for (int64_t g = 0; g < full / 8; ++g)
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t p = 0; p < 16; ++p)
        std::memcpy(out + size_t(g * 128 + p * 8 + i) * kPairBytes, in + size_t((g * 8 + i) * 16 + p) * kPairBytes,
                    kPairBytes);
  const size_t tail = size_t(full * 16) * kPairBytes;  // trailing blocks stay in natural order
  std::memcpy(out + tail, in + tail, size_t((nb - full) * 16) * kPairBytes);
}
}  // namespace

void q8_to_slot_order(const int8_t* natural, int8_t* slots, int64_t nb) {
  pairs_to_slot_order<2>(natural, slots, nb);
}

void q16_to_slot_order(const int16_t* natural, int16_t* slots, int64_t nb) {
  pairs_to_slot_order<4>(natural, slots, nb);
}

void q4_pack(const uint8_t* natural_nibbles, uint8_t* q, int64_t nb) {
  std::vector<uint8_t> slots(static_cast<size_t>(nb * kQuantBlock));
  q8_to_slot_order(reinterpret_cast<const int8_t*>(natural_nibbles), reinterpret_cast<int8_t*>(slots.data()), nb);
  std::memset(q, 0, static_cast<size_t>(nb * kQuantBlock / 2));
  for (int64_t s = 0; s < nb * kQuantBlock; ++s) {
    const Q4Place at = q4_place(nb, s);
    q[at.byte] = static_cast<uint8_t>(at.high ? (q[at.byte] & 0x0f) | (slots[size_t(s)] << 4)
                                              : (q[at.byte] & 0xf0) | slots[size_t(s)]);
  }
}

void quantize_row_ref(WeightFormat format, const float* src, uint8_t* dst, int64_t cols) {
  switch (format) {
    case WeightFormat::f32: std::memcpy(dst, src, 4 * static_cast<size_t>(cols)); return;
    case WeightFormat::bf16: {
      auto* o = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < cols; ++i) o[i] = fp32_to_bf16(src[i]);
      return;
    }
    case WeightFormat::q8: quantize_row_q8_ref(src, dst, cols); return;
    case WeightFormat::q4: quantize_row_q4_ref(src, dst, cols); return;
  }
}

void dequantize_row_ref(WeightFormat format, const uint8_t* src, float* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  switch (format) {
    case WeightFormat::f32: std::memcpy(dst, src, 4 * static_cast<size_t>(cols)); return;
    case WeightFormat::bf16: {
      const auto* w = reinterpret_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < cols; ++i) dst[i] = bf16_to_fp32(w[i]);
      return;
    }
    case WeightFormat::q8: {
      const auto* d = reinterpret_cast<const uint16_t*>(src);
      const auto* q = reinterpret_cast<const int8_t*>(src + 2 * nb);
      for (int64_t i = 0; i < cols; ++i)
        dst[i] = fp16_to_fp32(d[i / kQuantBlock]) * q[quant_slot(nb, i / kQuantBlock, i % kQuantBlock)];
      return;
    }
    case WeightFormat::q4: {
      const auto* d = reinterpret_cast<const uint16_t*>(src);
      const auto* m = d + nb;
      const uint8_t* q = src + 4 * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const float dd = fp16_to_fp32(d[b]), mm = fp16_to_fp32(m[b]);
        for (int j = 0; j < kQuantBlock; ++j)
          dst[b * kQuantBlock + j] = mm + dd * static_cast<float>(q4_value(q, nb, quant_slot(nb, b, j)));
      }
      return;
    }
  }
}

void quantize_acts_ref(const float* x, int64_t k, int16_t* q, int32_t* block_sum, float* d) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float dd = amax / 32767.0f;
  const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
  *d = dd;
  const int64_t nb = k / kQuantBlock;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sum = 0;
    for (int64_t j = 0; j < kQuantBlock; ++j) {
      const auto v = static_cast<int16_t>(std::clamp(std::nearbyint(x[b * kQuantBlock + j] * id), -32767.0f, 32767.0f));
      q[quant_slot(nb, b, j)] = v;
      sum += v;
    }
    block_sum[b] = sum;
  }
}

void ActQ16Buffer::reserve(int64_t n, int64_t k) {
  const auto nk = static_cast<size_t>(n * k);
  if (q_.size() < nk) q_.resize(nk);
  if (block_sum_.size() < nk / kQuantBlock) block_sum_.resize(nk / kQuantBlock);
  if (d_.size() < static_cast<size_t>(n)) d_.resize(static_cast<size_t>(n));
}

ActQ16View ActQ16Buffer::quantize(const float* x, int64_t n, int64_t k, QuantizeActsFn fn) {
  reserve(n, k);
  const int64_t nb = k / kQuantBlock;
  for (int64_t t = 0; t < n; ++t)
    fn(x + t * k, k, q_.data() + t * k, block_sum_.data() + t * nb, d_.data() + t);
  return ActQ16View{n, k, q_.data(), block_sum_.data(), d_.data()};
}

}  // namespace kiln::engine::cpu
