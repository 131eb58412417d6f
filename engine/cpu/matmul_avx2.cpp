// AVX2 + FMA + F16C kernels: matrix products over f32/bf16/q8/q4 weights and the fast
// quantizers. Compiled for that target with a pragma (the rest of the build stays baseline
// x86-64) and only called after CPUID says the CPU has it. Twins: matmul_ref.cpp and
// quant_ref.cpp; tests/engine/kernel_matmul_test.cpp and quant_fns_test.cpp compare them.
//
// Integer products: q8 weights are sign-extended to int16 and multiplied with the int16
// activations by vpmaddwd (16 products, summed in pairs, per instruction); each 32-weight block's
// int32 lane sums are converted once and scaled by the block's fp16 scale. q4 nibbles are
// zero-extended the same way; its offset term m·Σx uses the precomputed activation block sums.
//
// Only intrinsics and functions of this file are used inside the target region, so no inline
// std:: function is ever instantiated with AVX2 code (which the linker could pick for all TUs).
#include <cstdint>
#include <cstring>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight fp16 scales starting at p (fewer at a row's tail) into out[8].
inline void load_scales(const uint16_t* p, int64_t count, float* out) {
  if (count >= 8) {
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = _cvtsh_ss(p[i]);
  }
}

inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

// Software prefetch of [p, p + bytes) into L1, one request per 64 bytes; called with consecutive
// spans, so every line of the stream is requested (bytes ≤ ~256 here).
// Prefetching past the end of the matrix is harmless: prefetches never fault.
inline void prefetch_span(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
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

// ---- q8: int8 weights × int16 activations ------------------------------------------------------
// Per 32-weight block and row: two sign-extending loads, two vpmaddwd against the token's int16
// activations, one int32 → f32 conversion and one FMA with the block's scale (~8 µops for 34
// bytes). That is ~40 GB/s of weights per core from L1/L2 on the dev machines (Zen 3), so decode
// is bound by memory latency, not arithmetic: the hardware prefetcher alone leaves the kernel at
// half the read bandwidth, hence the software prefetch (prefetch_span) two tiles ahead.
// (int8 activations with vpmaddubsw were measured no faster per block on Zen 3 and would add the
// activations' 8-bit rounding, ~0.5% on their own, to every product.)
struct Q8Tile {
  template <int R, int T>
  static void run(const WeightMatrix& w, int64_t r, const MatmulInput& x, int64_t t, float* y,
                  int64_t ldy) {
    const int64_t k = w.cols, nb = k / kQuantBlock;
    const uint16_t* ds[R];
    const int8_t* qs[R];
    for (int i = 0; i < R; ++i) {
      ds[i] = reinterpret_cast<const uint16_t*>(w.row(r + i));
      qs[i] = reinterpret_cast<const int8_t*>(w.row(r + i) + 2 * nb);
    }
    // Decode streams the matrix once: fetch the tile two ahead while this one computes.
    const uint8_t* ahead = w.row(r) + 2 * R * w.stride();
    const int64_t ahead_step = R * w.stride() / nb;  // bytes of the tile per block
    __m256 acc[R][T];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
    alignas(32) float scale[R][8];
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      const int64_t cnt = nb - b0 < 8 ? nb - b0 : 8;
      for (int i = 0; i < R; ++i) load_scales(ds[i] + b0, cnt, scale[i]);
      for (int64_t bb = 0; bb < cnt; ++bb) {
        const int64_t off = (b0 + bb) * kQuantBlock;
        if (T == 1) prefetch_span(ahead + (b0 + bb) * ahead_step, ahead_step);
        __m256i w0[R], w1[R];
        for (int i = 0; i < R; ++i) {
          w0[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[i] + off)));
          w1[i] = _mm256_cvtepi8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[i] + off + 16)));
        }
        for (int j = 0; j < T; ++j) {
          const int16_t* xq = x.q16.q + (t + j) * k + off;
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
          for (int i = 0; i < R; ++i) {
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w0[i], x0), _mm256_madd_epi16(w1[i], x1));
            acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(&scale[i][bb]), acc[i][j]);
          }
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) y[(t + j) * ldy + r + i] = x.q16.d[t + j] * hsum(acc[i][j]);
  }
};

// ---- q4: uint4 weights (w = m + d·q) × int16 activations ---------------------------------------
// A block's 16 bytes are zero-extended to 16-bit lanes once; lane j then holds q_j + 16·q_{j+16},
// so `& 15` and `>> 4` give both halves in order (no byte-level unpacking). The offset term
// m·Σx takes one FMA per 8 blocks: eight fp16 offsets × the eight precomputed activation block sums.
struct Q4Tile {
  template <int R, int T>
  static void run(const WeightMatrix& w, int64_t r, const MatmulInput& x, int64_t t, float* y,
                  int64_t ldy) {
    const int64_t k = w.cols, nb = k / kQuantBlock;
    const uint16_t* ds[R];
    const uint8_t* qs[R];
    for (int i = 0; i < R; ++i) {
      ds[i] = reinterpret_cast<const uint16_t*>(w.row(r + i));
      qs[i] = w.row(r + i) + 4 * nb;
    }
    const uint8_t* ahead = w.row(r) + 2 * R * w.stride();
    const int64_t ahead_step = R * w.stride() / nb;
    const __m256i low4 = _mm256_set1_epi16(0x0f);
    __m256 acc[R][T];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
    alignas(32) float scale[R][8];
    alignas(32) float offset[R][8];
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      const int64_t cnt = nb - b0 < 8 ? nb - b0 : 8;
      for (int i = 0; i < R; ++i) {
        load_scales(ds[i] + b0, cnt, scale[i]);
        load_scales(ds[i] + nb + b0, cnt, offset[i]);
        for (int64_t u = cnt; u < 8; ++u) offset[i][u] = 0.0f;  // tail: lanes past the row
      }
      // Offset term: Σ_b m_b · (Σ x_q over block b), eight blocks per vector.
      for (int j = 0; j < T; ++j) {
        const int32_t* bs = x.q16.block_sum + (t + j) * nb + b0;
        __m256 bsv;
        if (cnt == 8) {
          bsv = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)));
        } else {
          alignas(32) float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t u = 0; u < cnt; ++u) tmp[u] = static_cast<float>(bs[u]);
          bsv = _mm256_load_ps(tmp);
        }
        for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(_mm256_load_ps(offset[i]), bsv, acc[i][j]);
      }
      for (int64_t bb = 0; bb < cnt; ++bb) {
        const int64_t off = (b0 + bb) * kQuantBlock;
        if (T == 1) prefetch_span(ahead + (b0 + bb) * ahead_step, ahead_step);
        __m256i w0[R], w1[R];
        for (int i = 0; i < R; ++i) {
          const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs[i] + off / 2)));
          w0[i] = _mm256_and_si256(v, low4);
          w1[i] = _mm256_srli_epi16(v, 4);
        }
        for (int j = 0; j < T; ++j) {
          const int16_t* xq = x.q16.q + (t + j) * k + off;
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
          for (int i = 0; i < R; ++i) {
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w0[i], x0), _mm256_madd_epi16(w1[i], x1));
            acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(&scale[i][bb]), acc[i][j]);
          }
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) y[(t + j) * ldy + r + i] = x.q16.d[t + j] * hsum(acc[i][j]);
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
void matmul_q8_avx2(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                    int64_t r0, int64_t r1) {
  tiles::drive<Q8Tile>(w, x, y, ldy, r0, r1);
}
void matmul_q4_avx2(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                    int64_t r0, int64_t r1) {
  tiles::drive<Q4Tile>(w, x, y, ldy, r0, r1);
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
  uint8_t* q = dst + 2 * nb;
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
}

void quantize_row_q4_avx2(const float* src, uint8_t* dst, int64_t cols) {
  const int64_t nb = cols / kQuantBlock;
  auto* d = reinterpret_cast<uint16_t*>(dst);
  uint16_t* m = d + nb;
  uint8_t* q = dst + 4 * nb;
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
    const __m128i l = _mm256_castsi256_si128(p), h = _mm256_extracti128_si256(p, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 16), _mm_or_si128(l, _mm_slli_epi16(h, 4)));
  }
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQuantBlock), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQuantBlock + 16), c);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    block_sum[b] = _mm_cvtsi128_si32(s);
  }
}

void quantize_f32_copy(const float* src, uint8_t* dst, int64_t cols) {
  std::memcpy(dst, src, 4 * static_cast<size_t>(cols));
}
void quantize_bf16_avx2(const float* src, uint8_t* dst, int64_t cols) {
  quantize_row_ref(WeightFormat::bf16, src, dst, cols);  // conversion only: not a hot path
}

const KernelTable kAvx2Table = {
    "avx2",
    {matmul_f32_avx2, matmul_bf16_avx2, matmul_q8_avx2, matmul_q4_avx2},
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
