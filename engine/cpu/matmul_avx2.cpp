// AVX2 + FMA + F16C kernels: matrix products over f32/bf16/q8/q4 weights and the fast
// quantizers. Compiled for that target with a pragma (the rest of the build stays baseline
// x86-64) and only called after CPUID says the CPU has it. Twins: matmul_ref.cpp and
// quant_ref.cpp; tests/engine/kernel_matmul_test.cpp and quant_fns_test.cpp compare them.
//
// The q8/q4 products live in matmul_quant_avx2.cpp (their own decode and prefill kernels); this
// file has the float tiles, the quantizers and the table.
//
// Only intrinsics and functions of this file are used inside the target region, so no inline
// std:: function is ever instantiated with AVX2 code (which the linker could pick for all TUs).
#include <cstdint>
#include <cstring>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_quant_avx2.h"

#include <vector>

namespace kiln::engine::cpu {
namespace {
// Per-thread scratch for one row in natural order, before it is put in slot order (quant.h).
uint8_t* natural_row_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}
}  // namespace
}  // namespace kiln::engine::cpu

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu {
namespace {

using tiles::hsum;
using tiles::prefetch_span;

inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

// ---- f32 and bf16: FMA over 8 columns at a time ------------------------------------------------
template <bool kBf16>
struct FloatTile {
  template <int R, int T>
  static void run(const WeightMatrix& w, int64_t r, const MatmulInput& x, int64_t t, float* y,
                  int64_t ldy) {
    __m256 acc[R][T];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
    const int64_t k = w.cols;
    const uint8_t* rows[R];
    for (int i = 0; i < R; ++i) rows[i] = w.row(r + i);
    // Decode: fetch the tile two ahead (R rows × 8 columns per step), as the q8/q4 tiles do.
    const uint8_t* ahead = w.row(r) + 2 * R * w.stride();
    const int64_t ahead_step = R * 8 * (kBf16 ? 2 : 4);
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      if (T == 1) prefetch_span(ahead + c / 8 * ahead_step, ahead_step);
      __m256 wv[R];
      for (int i = 0; i < R; ++i)
        wv[i] = kBf16 ? load8_bf16(reinterpret_cast<const uint16_t*>(rows[i]) + c)
                      : _mm256_loadu_ps(reinterpret_cast<const float*>(rows[i]) + c);
      for (int j = 0; j < T; ++j) {
        const __m256 xv = _mm256_loadu_ps(x.f32 + (t + j) * k + c);
        for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) {
        float s = hsum(acc[i][j]);
        for (int64_t cc = c; cc < k; ++cc) {  // columns past the last multiple of 8
          const float wf = kBf16 ? bf16_to_fp32(reinterpret_cast<const uint16_t*>(rows[i])[cc])
                                 : reinterpret_cast<const float*>(rows[i])[cc];
          s += wf * x.f32[(t + j) * k + cc];
        }
        y[(t + j) * ldy + r + i] = s;
      }
  }
};

void matmul_f32_avx2(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                     int64_t r0, int64_t r1) {
  tiles::drive<FloatTile<false>>(w, x, y, ldy, r0, r1);
}
void matmul_bf16_avx2(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                      int64_t r0, int64_t r1) {
  tiles::drive<FloatTile<true>>(w, x, y, ldy, r0, r1);
}

// ---- quantizers: same arithmetic as quant_ref.cpp, so the bytes are identical ------------------
inline float block_amax(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  for (int j = 8; j < 32; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 floats → 32 int32 (rounded to nearest even, clamped) → 32 packed int8 in order.
inline __m256i round_pack_i8(const float* x, __m256 mul, __m256 sub, __m256 lo, __m256 hi) {
  __m256i v[4];
  for (int j = 0; j < 4; ++j) {
    __m256 f = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * j), sub), mul);
    f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
  }
  const __m256i a = _mm256_packs_epi32(v[0], v[1]);
  const __m256i b = _mm256_packs_epi32(v[2], v[3]);
  const __m256i p = _mm256_packs_epi16(a, b);  // lanes interleaved by 4-byte groups
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void quantize_row_q8_avx2(const float* src, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  auto* d = reinterpret_cast<uint16_t*>(dst);
  uint8_t* q = natural_row_scratch(static_cast<size_t>(cols));
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQuantBlock;
    const uint16_t d16 = fp32_to_fp16(block_amax(x) / 127.0f);
    const float dd = fp16_to_fp32(d16);
    const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    d[b] = d16;
    const __m256i p = round_pack_i8(x, _mm256_set1_ps(id), _mm256_setzero_ps(),
                                    _mm256_set1_ps(-127.0f), _mm256_set1_ps(127.0f));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQuantBlock), p);
  }
  q8_to_slot_order(reinterpret_cast<const int8_t*>(q), reinterpret_cast<int8_t*>(dst + 2 * nb), nb);
}

void quantize_row_q4_avx2(const float* src, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  auto* d = reinterpret_cast<uint16_t*>(dst);
  uint16_t* m = d + nb;
  uint8_t* nib = natural_row_scratch(static_cast<size_t>(cols));
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQuantBlock;
    __m256 lo = _mm256_loadu_ps(x), hi = lo;
    for (int j = 8; j < 32; j += 8) {
      lo = _mm256_min_ps(lo, _mm256_loadu_ps(x + j));
      hi = _mm256_max_ps(hi, _mm256_loadu_ps(x + j));
    }
    alignas(32) float l8[8], h8[8];
    _mm256_store_ps(l8, lo);
    _mm256_store_ps(h8, hi);
    float mn = l8[0], mx = h8[0];
    for (int j = 1; j < 8; ++j) {
      mn = l8[j] < mn ? l8[j] : mn;
      mx = h8[j] > mx ? h8[j] : mx;
    }
    const uint16_t d16 = fp32_to_fp16((mx - mn) / 15.0f);
    const uint16_t m16 = fp32_to_fp16(mn);
    const float dd = fp16_to_fp32(d16), mm = fp16_to_fp32(m16);
    const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    d[b] = d16;
    m[b] = m16;
    const __m256i p = round_pack_i8(x, _mm256_set1_ps(id), _mm256_set1_ps(mm), _mm256_setzero_ps(),
                                    _mm256_set1_ps(15.0f));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(nib + b * kQuantBlock), p);
  }
  q4_pack(nib, dst + 4 * nb, nb);
}

void quantize_acts_avx2(const float* x, int64_t k, int16_t* q, int32_t* block_sum, float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  alignas(32) float m8[8];
  _mm256_store_ps(m8, m);
  float amax = 0.0f;
  for (int j = 0; j < 8; ++j) amax = m8[j] > amax ? m8[j] : amax;
  const float dd = amax / 32767.0f;
  const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
  *d = dd;
  const __m256 mul = _mm256_set1_ps(id), lo = _mm256_set1_ps(-32767.0f), hi = _mm256_set1_ps(32767.0f);
  int16_t* natural = reinterpret_cast<int16_t*>(natural_row_scratch(2 * static_cast<size_t>(k)));
  for (int64_t b = 0; b < k / kQuantBlock; ++b) {
    __m256i v[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + b * kQuantBlock + 8 * j), mul);
      f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
      sum = _mm256_add_epi32(sum, v[j]);
    }
    const __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xd8);
    const __m256i c = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2], v[3]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(natural + b * kQuantBlock), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(natural + b * kQuantBlock + 16), c);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    block_sum[b] = _mm_cvtsi128_si32(s);
  }
  q16_to_slot_order(natural, q, k / kQuantBlock);
}

void quantize_f32_copy(const float* src, uint8_t* dst, int64_t cols) {
  std::memcpy(dst, src, 4 * static_cast<size_t>(cols));
}
void quantize_bf16_avx2(const float* src, uint8_t* dst, int64_t cols) {
  quantize_row_ref(WeightFormat::bf16, src, dst, cols);  // conversion only: not a hot path
}

const KernelTable kAvx2Table = {
    "avx2",
    {matmul_f32_avx2, matmul_bf16_avx2, avx2::matmul_q8, avx2::matmul_q4},
    {quantize_f32_copy, quantize_bf16_avx2, quantize_row_q8_avx2, quantize_row_q4_avx2},
    quantize_acts_avx2,
};

}  // namespace
}  // namespace kiln::engine::cpu
#pragma GCC pop_options
#endif  // __x86_64__

namespace kiln::engine::cpu {

const KernelTable* kernels_avx2() {
#if defined(__x86_64__)
  if (cpu_features().has_avx2_set()) return &kAvx2Table;
#endif
  return nullptr;
}

}  // namespace kiln::engine::cpu
