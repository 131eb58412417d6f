// q8/q4 helpers shared by the AVX2 and AVX-512 quantized kernels (matmul_quant_avx2.cpp,
// matmul_quant_avx512.cpp): where a row's scales and quants are, one block or pair as int16, the
// trailing-block fold, and the panel unpacking of the prefill kernels. Include only inside a
// target region of at least "avx2,fma,f16c". Everything here has internal linkage, so the copies
// compiled for different targets never meet at link time (one would run on a CPU without it).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/cpu/matmul.h"

namespace kiln::engine::cpu::quant_tiles {
namespace {

constexpr int kPanelRows = int(kQuantPanelRows);  // two vectors of 8 rows

// ---- formats: where a row's scales, offsets and quants are, and one block as int16 ----------
struct Q8 {
  static constexpr bool kOffset = false;
  static const uint8_t* quants(const uint8_t* row, int64_t nb) { return row + 2 * nb; }
  // Pair p of the eight blocks of group g (slot order, quant.h) as int16: lane i is block 8g+i.
  static __m256i group_pairs(const uint8_t* q, int64_t g, int p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 256 + p * 16)));
  }
  // Weights 0..15 and 16..31 of block b (a trailing block: natural order), sign-extended to int16.
  static void block(const uint8_t* q, int64_t b, __m256i& w0, __m256i& w1) {
    const auto* p = reinterpret_cast<const __m128i*>(q + b * kQuantBlock);
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1));
  }
};

struct Q4 {
  static constexpr bool kOffset = true;
  static const uint8_t* quants(const uint8_t* row, int64_t nb) { return row + 4 * nb; }
  // A group's byte o holds slot o (low nibble) and o + 128 (high): pairs 0-7 are low nibbles.
  static __m256i group_pairs(const uint8_t* q, int64_t g, int p) {
    const __m256i v = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 128 + (p & 7) * 16)));
    return p < 8 ? _mm256_and_si256(v, _mm256_set1_epi16(0x0f)) : _mm256_srli_epi16(v, 4);
  }
  // A trailing block's byte j holds weight j (low nibble) and 16 + j (high nibble):
  // zero-extended to 16 bits, `& 15` and `>> 4` give both halves in order.
  static void block(const uint8_t* q, int64_t b, __m256i& w0, __m256i& w1) {
    const __m256i v = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * (kQuantBlock / 2))));
    w0 = _mm256_and_si256(v, _mm256_set1_epi16(0x0f));
    w1 = _mm256_srli_epi16(v, 4);
  }
};

// Up to eight fp16 values from p as floats; lanes past `count` are zero.
inline __m256 load_halfs(const uint16_t* p, int64_t count) {
  if (count >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < count; ++i) tmp[i] = p[i];
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

// Up to eight int32 values from p as floats; lanes past `count` are zero.
inline __m256 load_ints_as_floats(const int32_t* p, int64_t count) {
  if (count >= 8) return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  alignas(32) int32_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < count; ++i) tmp[i] = p[i];
  return _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tmp)));
}

// Lane j of the result = the sum of the 8 lanes of s[j] (exact: int32).
inline __m256i reduce8(const __m256i* s) {
  const __m256i h01 = _mm256_hadd_epi32(s[0], s[1]);
  const __m256i h23 = _mm256_hadd_epi32(s[2], s[3]);
  const __m256i h45 = _mm256_hadd_epi32(s[4], s[5]);
  const __m256i h67 = _mm256_hadd_epi32(s[6], s[7]);
  const __m256i lo = _mm256_hadd_epi32(h01, h23);  // s0..s3 over lanes 0-3 | over lanes 4-7
  const __m256i hi = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
}

// The row's trailing `cnt` (< 8) blocks from b0 (a multiple of 8), folded into acc[NT]: each
// block's lanes per token are reduced by reduce8 and scaled with one FMA.
template <class F, int NT>
inline void stream_tail(const uint16_t* d, const uint8_t* q, int64_t nb, int64_t b0, int64_t cnt,
                        const int16_t* const* xq, const int32_t* const* xsum, __m256* acc) {
  for (int j = 0; j < NT; ++j) {
    __m256i s[8];
    for (int64_t i = 0; i < 8; ++i) {
      if (i >= cnt) {
        s[i] = _mm256_setzero_si256();
        continue;
      }
      __m256i w0, w1;
      F::block(q, b0 + i, w0, w1);
      const auto* xp = reinterpret_cast<const __m256i*>(xq[j] + (b0 + i) * kQuantBlock);
      s[i] = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xp)),
                              _mm256_madd_epi16(w1, _mm256_loadu_si256(xp + 1)));
    }
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(s)), load_halfs(d + b0, cnt), acc[j]);
    if constexpr (F::kOffset)
      acc[j] = _mm256_fmadd_ps(load_halfs(d + nb + b0, cnt), load_ints_as_floats(xsum[j] + b0, cnt), acc[j]);
  }
}

// Transposes eight vectors of eight int32 (m[i] lane c) into col[c] lane i.
inline void transpose8x8(const __m256i* m, __m256i* col) {
  const __m256i t0 = _mm256_unpacklo_epi32(m[0], m[1]), t1 = _mm256_unpackhi_epi32(m[0], m[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(m[2], m[3]), t3 = _mm256_unpackhi_epi32(m[2], m[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(m[4], m[5]), t5 = _mm256_unpackhi_epi32(m[4], m[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(m[6], m[7]), t7 = _mm256_unpackhi_epi32(m[6], m[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  col[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  col[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  col[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  col[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  col[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  col[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  col[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  col[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// fp16 values [off, off + nb) of eight rows (nullptr: a missing row, zeros) as floats, block-major:
// out[b·kPanelRows + i] is row i's value b. Eight blocks at a time: a row's eight values convert
// as one vector, and an 8×8 transpose turns rows into blocks.
inline void unpack_scales(const uint16_t* const* d, int64_t off, int64_t nb, float* out) {
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i m[8], col[8];
    for (int i = 0; i < 8; ++i)
      m[i] = d[i] ? _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + off + b))))
                  : _mm256_setzero_si256();
    transpose8x8(m, col);
    for (int c = 0; c < 8; ++c) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (b + c) * kPanelRows), col[c]);
  }
  for (; b < nb; ++b)
    for (int i = 0; i < 8; ++i) out[b * kPanelRows + i] = d[i] ? _cvtsh_ss(d[i][off + b]) : 0.0f;
}

// Unpacks rows [r, r + n) (n ≤ 16; missing rows are zero) into the panel layout: pair p of block b
// for 16 rows at p.w + b·512 + p·32. In a group, the eight rows' pair-p vectors (lanes = blocks)
// transpose into one vector per block (lanes = rows); a trailing block's two halves (lanes =
// pairs) transpose into one vector per pair.
template <class F>
void unpack_panel(const WeightMatrix& w, int64_t r, int64_t n, const QuantPanelScratch& p) {
  const int64_t nb = w.cols / kQuantBlock, groups = nb / 8;
  for (int v = 0; v < 2; ++v) {
    const uint8_t* q[8];
    const uint16_t* d[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t row = v * 8 + i;
      q[i] = row < n ? F::quants(w.row(r + row), nb) : nullptr;
      d[i] = row < n ? reinterpret_cast<const uint16_t*>(w.row(r + row)) : nullptr;
    }
    __m256i m[8], col[8];
    for (int64_t g = 0; g < groups; ++g)
      for (int pr = 0; pr < 16; ++pr) {
        for (int i = 0; i < 8; ++i) m[i] = q[i] ? F::group_pairs(q[i], g, pr) : _mm256_setzero_si256();
        transpose8x8(m, col);
        int16_t* out = p.w + (8 * g) * (kQuantBlock * kPanelRows) + v * 8 * 2 + pr * 2 * kPanelRows;
        for (int c = 0; c < 8; ++c)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c * (kQuantBlock * kPanelRows)), col[c]);
      }
    for (int64_t b = groups * 8; b < nb; ++b) {
      __m256i lo[8], hi[8];
      for (int i = 0; i < 8; ++i) {
        if (q[i]) {
          F::block(q[i], b, lo[i], hi[i]);
        } else {
          lo[i] = hi[i] = _mm256_setzero_si256();
        }
      }
      for (int half = 0; half < 2; ++half) {
        transpose8x8(half ? hi : lo, col);
        int16_t* out = p.w + b * (kQuantBlock * kPanelRows) + v * 16;
        for (int c = 0; c < 8; ++c)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (half * 8 + c) * 2 * kPanelRows), col[c]);
      }
    }
    unpack_scales(d, 0, nb, p.d + v * 8);
    if constexpr (F::kOffset) unpack_scales(d, nb, nb, p.m + v * 8);
  }
}

// The prefill kernels' prefetch of the next panel (rows [r, r + 16) ∩ [r, r1)) into L2 while the
// current one computes, in even slices, one before each of `tiles` token tiles and the rest after:
// all at once, its 256+ line requests would fill the miss queues and stall the first tile.
class NextPanelPrefetch {
 public:
  NextPanelPrefetch(const WeightMatrix& w, int64_t r, int64_t r1, int64_t tiles) {
    const int64_t rows = r1 - r < kPanelRows ? r1 - r : kPanelRows;
    next_ = rows > 0 ? reinterpret_cast<const char*>(w.row(r)) : nullptr;
    lines_ = next_ ? (rows * static_cast<int64_t>(w.stride()) + 63) / 64 : 0;
    per_tile_ = (lines_ + tiles) / (tiles + 1);
  }
  void slice() {
    for (const int64_t e = sent_ + per_tile_ < lines_ ? sent_ + per_tile_ : lines_; sent_ < e; ++sent_)
      _mm_prefetch(next_ + 64 * sent_, _MM_HINT_T1);
  }
  void rest() {
    for (; sent_ < lines_; ++sent_) _mm_prefetch(next_ + 64 * sent_, _MM_HINT_T1);
  }

 private:
  const char* next_ = nullptr;
  int64_t lines_ = 0, per_tile_ = 0, sent_ = 0;
};

// Tokens [t0, t0 + n) of x.
inline MatmulInput token_range(const MatmulInput& x, int64_t t0, int64_t n) {
  MatmulInput v = x;
  v.n = v.q16.n = n;
  v.q16.q += t0 * x.k;
  v.q16.block_sum += t0 * (x.k / kQuantBlock);
  v.q16.d += t0;
  return v;
}

}  // namespace
}  // namespace kiln::engine::cpu::quant_tiles
