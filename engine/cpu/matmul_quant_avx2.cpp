// q8 and q4 products on AVX2: a streaming kernel for decode (one to four tokens: each weight
// block is read and widened once for all of them; five to eight in two passes) and a
// register-blocked matrix-matrix kernel for prefill (nine tokens or more).
//
// Both compute every output with the same floating-point operations, in the same order, as
// matmul_ref.cpp's definition, so an output does not depend on how many tokens share the call
// (a session's logits are bitwise the same alone or batched) nor on the kernel table:
//   s_b = Σ_{i in block b} q_w[i]·q_x[i]                 exact int32
//   a_j = fma(float(s_b), d_b, a_j)  for b ≡ j (mod 8), b ascending, j = 0..7
//         q4 then: a_j = fma(m_b, float(Σ_{i in b} q_x[i]), a_j)
//   y   = d_x · (((a_0 + a_4) + (a_2 + a_6)) + ((a_1 + a_5) + (a_3 + a_7)))
// Integer sums are exact, so how a kernel arranges them never shows in the result.
//
// Streaming (T ≤ 4): one row at a time; a block's 32 products come from two vpmaddwd into 8
// int32 lanes per token, eight blocks' lanes are reduced together by vphaddd into one vector
// (lane j = block b0 + j) and scaled by the row's eight fp16 scales with one FMA: the a_j are
// the lanes. Software prefetch runs 8 rows ahead (the hardware prefetcher alone leaves the
// stream at half the read bandwidth). For a few tokens this costs less than unpacking a panel
// (batched decode: most experts see one to three tokens).
//
// Five to eight tokens: two streaming passes per 16 rows (tokens 0-3, then the rest); the second
// reads the rows from L1, so weights still leave memory once, and nothing is unpacked.
//
// Nine or more: weights are unpacked once per 16-row panel to int16, interleaved so that one
// 32-byte vector holds one pair of columns of 8 rows; each column pair of a token is broadcast as one
// int32 and vpmaddwd gives the pair's products for 8 rows at once. A 16-row × 4-token tile
// keeps 8 int32 accumulators per block in registers (no horizontal sums at all); at the end of
// a block they are scaled into a_j held in L1. vpmaddwd issues 2/cycle on Zen 3; this kernel
// keeps ~1 in flight per cycle, ~1.6–2× the previous per-block-scaled tile.
#include "engine/cpu/matmul_quant_avx2.h"

#include <cstring>
#include <vector>

namespace kiln::engine::cpu::avx2 {
namespace {

constexpr int kPanelRows = int(kQuantPanelRows);  // two vectors of 8 rows
constexpr int kTokenTile = 4;

// Per-thread scratch for one unpacked panel, grown on first use and reused (defined outside the
// AVX2 region so no std:: template is instantiated with AVX2 code).
struct PanelScratch {
  int16_t* w;  // [block][pair 0..15][row 0..15][2]
  float* d;    // [block][row 0..15] block scales
  float* m;    // [block][row 0..15] q4 block offsets
};

PanelScratch panel_scratch(int64_t k) {
  thread_local std::vector<int16_t> w;
  thread_local std::vector<float> d, m;
  const auto nb = static_cast<size_t>(k / kQuantBlock);
  if (w.size() < nb * kQuantBlock * kPanelRows) w.resize(nb * kQuantBlock * kPanelRows);
  if (d.size() < nb * kPanelRows) {
    d.resize(nb * kPanelRows);
    m.resize(nb * kPanelRows);
  }
  return {w.data(), d.data(), m.data()};
}

}  // namespace
}  // namespace kiln::engine::cpu::avx2

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu::avx2 {
namespace {

using tiles::hsum;  // the fixed final order of the definition
using tiles::prefetch_span;

// ---- formats: where a row's scales, offsets and quants are, and one block as int16 ----------
struct Q8 {
  static constexpr bool kOffset = false;
  static const uint8_t* quants(const uint8_t* row, int64_t nb) { return row + 2 * nb; }
  // Weights 0..15 and 16..31 of block b, sign-extended to int16.
  static void block(const uint8_t* q, int64_t b, __m256i& w0, __m256i& w1) {
    const auto* p = reinterpret_cast<const __m128i*>(q + b * kQuantBlock);
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1));
  }
};

struct Q4 {
  static constexpr bool kOffset = true;
  static const uint8_t* quants(const uint8_t* row, int64_t nb) { return row + 4 * nb; }
  // Byte j holds weight j (low nibble) and 16 + j (high nibble): zero-extended to 16 bits,
  // `& 15` and `>> 4` give both halves in order.
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

// ---- decode: one to four tokens, weights streamed once ----------------------------------------
// Each block is loaded and widened once and multiplied with every token's activations; per
// token, eight blocks' lanes are reduced together (reduce8) and scaled with one FMA.
constexpr int64_t kPrefetchRows = 8;

// One group of eight blocks (kFull) or the row's last `cnt` blocks, folded into acc[NT].
// kFull lets the compiler unroll the group completely with no per-block branch.
template <class F, int NT, bool kFull>
inline void stream_group(const uint16_t* d, const uint8_t* q, int64_t nb, int64_t b0, int64_t cnt,
                         const int16_t* const* xq, const int32_t* const* xsum,
                         const uint8_t* ahead, int64_t ahead_step, __m256* acc) {
  __m256i s[NT][8];
#pragma GCC unroll 8
  for (int64_t i = 0; i < 8; ++i) {
    if (!kFull && i >= cnt) {
      for (int j = 0; j < NT; ++j) s[j][i] = _mm256_setzero_si256();
      continue;
    }
    const int64_t b = b0 + i;
    // One line request per block: a row's bytes per block (34 q8, 20 q4) are under a line,
    // so consecutive blocks touch every line of the row kPrefetchRows ahead.
    _mm_prefetch(reinterpret_cast<const char*>(ahead + b * ahead_step), _MM_HINT_T0);
    __m256i w0, w1;
    F::block(q, b, w0, w1);
    for (int j = 0; j < NT; ++j) {
      const auto* xp = reinterpret_cast<const __m256i*>(xq[j] + b * kQuantBlock);
      s[j][i] = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xp)),
                                 _mm256_madd_epi16(w1, _mm256_loadu_si256(xp + 1)));
    }
  }
  const int64_t n = kFull ? 8 : cnt;
  const __m256 dv = load_halfs(d + b0, n);
  for (int j = 0; j < NT; ++j) {
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(s[j])), dv, acc[j]);
    if constexpr (F::kOffset)
      acc[j] = _mm256_fmadd_ps(load_halfs(d + nb + b0, n), load_ints_as_floats(xsum[j] + b0, n), acc[j]);
  }
}

template <class F, int NT>
void matvec(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t k = w.cols, nb = k / kQuantBlock;
  const int64_t stride = static_cast<int64_t>(w.stride());
  const int64_t ahead_step = (stride + nb - 1) / nb;  // bytes of a row per block, rounded up
  const int16_t* xq[NT];
  const int32_t* xsum[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = x.q16.q + j * k;
    xsum[j] = x.q16.block_sum + j * nb;
  }
  // A range starts cold: request its first rows now, the loop keeps kPrefetchRows ahead.
  for (int64_t r = r0; r < r1 && r < r0 + kPrefetchRows; ++r) prefetch_span(w.row(r), stride);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    const auto* d = reinterpret_cast<const uint16_t*>(row);
    const uint8_t* q = F::quants(row, nb);
    const uint8_t* ahead = row + kPrefetchRows * stride;  // past the matrix: prefetches never fault
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) stream_group<F, NT, true>(d, q, nb, b0, 8, xq, xsum, ahead, ahead_step, acc);
    if (b0 < nb) stream_group<F, NT, false>(d, q, nb, b0, nb - b0, xq, xsum, ahead, ahead_step, acc);
    for (int j = 0; j < NT; ++j) y[j * ldy + r] = x.q16.d[j] * hsum(acc[j]);
  }
}

// ---- T > 4: panels of 16 rows × tiles of 4 tokens ---------------------------------------------

// Unpacks rows [r, r + n) (n ≤ 16; missing rows are zero) into the panel layout.
template <class F>
void unpack_panel(const WeightMatrix& w, int64_t r, int64_t n, const PanelScratch& p) {
  const int64_t nb = w.cols / kQuantBlock;
  for (int v = 0; v < 2; ++v) {
    const uint8_t* q[8];
    const uint16_t* d[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t row = v * 8 + i;
      q[i] = row < n ? F::quants(w.row(r + row), nb) : nullptr;
      d[i] = row < n ? reinterpret_cast<const uint16_t*>(w.row(r + row)) : nullptr;
    }
    for (int64_t b = 0; b < nb; ++b) {
      // rows × column pairs (as int32) → column pairs × rows: two 8×8 transposes.
      __m256i lo[8], hi[8];
      for (int i = 0; i < 8; ++i) {
        if (q[i]) {
          F::block(q[i], b, lo[i], hi[i]);
        } else {
          lo[i] = hi[i] = _mm256_setzero_si256();
        }
      }
      for (int half = 0; half < 2; ++half) {
        const __m256i* m = half ? hi : lo;
        const __m256i t0 = _mm256_unpacklo_epi32(m[0], m[1]), t1 = _mm256_unpackhi_epi32(m[0], m[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(m[2], m[3]), t3 = _mm256_unpackhi_epi32(m[2], m[3]);
        const __m256i t4 = _mm256_unpacklo_epi32(m[4], m[5]), t5 = _mm256_unpackhi_epi32(m[4], m[5]);
        const __m256i t6 = _mm256_unpacklo_epi32(m[6], m[7]), t7 = _mm256_unpackhi_epi32(m[6], m[7]);
        const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
        const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
        const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
        const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
        const __m256i col[8] = {
            _mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
            _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
            _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
            _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
        int16_t* out = p.w + b * (kQuantBlock * kPanelRows) + v * 16;
        for (int c = 0; c < 8; ++c)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (half * 8 + c) * 2 * kPanelRows), col[c]);
      }
    }
    for (int i = 0; i < 8; ++i) {
      const int64_t row = v * 8 + i;
      for (int64_t b = 0; b < nb; ++b) {
        p.d[b * kPanelRows + row] = d[i] ? _cvtsh_ss(d[i][b]) : 0.0f;
        if constexpr (F::kOffset) p.m[b * kPanelRows + row] = d[i] ? _cvtsh_ss(d[i][nb + b]) : 0.0f;
      }
    }
  }
}

// One panel × NT tokens starting at t. Writes rows [r, r + n) of those tokens.
template <class F, int NT>
void panel_tile(const PanelScratch& p, const MatmulInput& x, int64_t t, float* y, int64_t ldy,
                int64_t r, int64_t n) {
  const int64_t k = x.k, nb = k / kQuantBlock;
  // a_j of every (token, row). Blocks 0..7 start their lane from zero (no memset: at 2 KiB
  // per tile it cost ~10% of this function); lanes no block reaches are zeroed here.
  alignas(32) float a[NT][8][kPanelRows];
  if (nb < 8)
    for (int j = 0; j < NT; ++j)
      for (int64_t l = nb; l < 8; ++l)
        for (int i = 0; i < kPanelRows; ++i) a[j][l][i] = 0.0f;
  const int16_t* xt[NT];
  for (int j = 0; j < NT; ++j) xt[j] = x.q16.q + (t + j) * k;
  for (int64_t b = 0; b < nb; ++b) {
    __m256i acc[2][NT];
    for (int j = 0; j < NT; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_si256();
    const int16_t* wb = p.w + b * (kQuantBlock * kPanelRows);
    const int64_t xo = b * kQuantBlock;
#pragma GCC unroll 4
    for (int pr = 0; pr < kQuantBlock / 2; ++pr) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + pr * 2 * kPanelRows));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + pr * 2 * kPanelRows + 16));
      for (int j = 0; j < NT; ++j) {
        int32_t pair;
        std::memcpy(&pair, xt[j] + xo + 2 * pr, 4);
        const __m256i xv = _mm256_set1_epi32(pair);
        acc[0][j] = _mm256_add_epi32(acc[0][j], _mm256_madd_epi16(w0, xv));
        acc[1][j] = _mm256_add_epi32(acc[1][j], _mm256_madd_epi16(w1, xv));
      }
    }
    const int lane = static_cast<int>(b & 7);
    for (int v = 0; v < 2; ++v) {
      const __m256 d = _mm256_loadu_ps(p.d + b * kPanelRows + 8 * v);
      for (int j = 0; j < NT; ++j) {
        float* aj = &a[j][lane][8 * v];
        __m256 s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[v][j]), d, b < 8 ? _mm256_setzero_ps() : _mm256_load_ps(aj));
        if constexpr (F::kOffset)
          s = _mm256_fmadd_ps(_mm256_loadu_ps(p.m + b * kPanelRows + 8 * v),
                              _mm256_set1_ps(static_cast<float>(x.q16.block_sum[(t + j) * nb + b])), s);
        _mm256_store_ps(aj, s);
      }
    }
  }
  for (int j = 0; j < NT; ++j) {
    const __m256 dx = _mm256_set1_ps(x.q16.d[t + j]);
    for (int v = 0; v < 2; ++v) {
      if (8 * v >= n) break;
      const float* aj[8];
      for (int l = 0; l < 8; ++l) aj[l] = &a[j][l][8 * v];
      const __m256 s0 = _mm256_add_ps(_mm256_load_ps(aj[0]), _mm256_load_ps(aj[4]));
      const __m256 s1 = _mm256_add_ps(_mm256_load_ps(aj[1]), _mm256_load_ps(aj[5]));
      const __m256 s2 = _mm256_add_ps(_mm256_load_ps(aj[2]), _mm256_load_ps(aj[6]));
      const __m256 s3 = _mm256_add_ps(_mm256_load_ps(aj[3]), _mm256_load_ps(aj[7]));
      const __m256 out = _mm256_mul_ps(dx, _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3)));
      float* yr = y + (t + j) * ldy + r + 8 * v;
      if (n - 8 * v >= 8) {
        _mm256_storeu_ps(yr, out);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, out);
        for (int64_t i = 0; i < n - 8 * v; ++i) yr[i] = tmp[i];
      }
    }
  }
}

template <class F>
void matmat(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const PanelScratch p = panel_scratch(w.cols);
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int64_t n = r1 - r < kPanelRows ? r1 - r : kPanelRows;
    unpack_panel<F>(w, r, n, p);
    // The next panel's weights travel to L2 while this one computes, a slice per token tile: all
    // at once, its 256+ line requests would fill the miss queues and stall the first tile.
    const int64_t next_rows = r1 - (r + n) < kPanelRows ? r1 - (r + n) : kPanelRows;
    const char* next = next_rows > 0 ? reinterpret_cast<const char*>(w.row(r + n)) : nullptr;
    const int64_t next_lines = next ? (next_rows * static_cast<int64_t>(w.stride()) + 63) / 64 : 0;
    const int64_t per_tile = (next_lines + x.n / kTokenTile) / (x.n / kTokenTile + 1);
    int64_t sent = 0;
    int64_t t = 0;
    for (; t + kTokenTile <= x.n; t += kTokenTile) {
      for (const int64_t e = sent + per_tile < next_lines ? sent + per_tile : next_lines; sent < e; ++sent)
        _mm_prefetch(next + 64 * sent, _MM_HINT_T1);
      panel_tile<F, kTokenTile>(p, x, t, y, ldy, r, n);
    }
    for (; sent < next_lines; ++sent) _mm_prefetch(next + 64 * sent, _MM_HINT_T1);
    switch (x.n - t) {
      case 3: panel_tile<F, 3>(p, x, t, y, ldy, r, n); break;
      case 2: panel_tile<F, 2>(p, x, t, y, ldy, r, n); break;
      case 1: panel_tile<F, 1>(p, x, t, y, ldy, r, n); break;
      default: break;
    }
  }
}

// Tokens [t0, t0 + n) of x.
inline MatmulInput token_range(const MatmulInput& x, int64_t t0, int64_t n) {
  MatmulInput v = x;
  v.n = v.q16.n = n;
  v.q16.q += t0 * x.k;
  v.q16.block_sum += t0 * (x.k / kQuantBlock);
  v.q16.d += t0;
  return v;
}

template <class F>
void stream(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (x.n) {
    case 1: return matvec<F, 1>(w, x, y, ldy, r0, r1);
    case 2: return matvec<F, 2>(w, x, y, ldy, r0, r1);
    case 3: return matvec<F, 3>(w, x, y, ldy, r0, r1);
    default: return matvec<F, 4>(w, x, y, ldy, r0, r1);
  }
}

template <class F>
void dispatch(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (r1 <= r0 || x.n <= 0) return;
  static_assert(kQuantStreamMaxTokens == 4, "the cases below");
  if (x.n <= 4) return stream<F>(w, x, y, ldy, r0, r1);
  if (x.n <= 8) {  // two streaming passes over 16 rows at a time; the second reads them from L1
    const MatmulInput lo = token_range(x, 0, 4), hi = token_range(x, 4, x.n - 4);
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      const int64_t re = r + kPanelRows < r1 ? r + kPanelRows : r1;
      stream<F>(w, lo, y, ldy, r, re);
      stream<F>(w, hi, y + 4 * ldy, ldy, r, re);
    }
    return;
  }
  matmat<F>(w, x, y, ldy, r0, r1);
}

}  // namespace

void matmul_q8(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  dispatch<Q8>(w, x, y, ldy, r0, r1);
}
void matmul_q4(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  dispatch<Q4>(w, x, y, ldy, r0, r1);
}

}  // namespace kiln::engine::cpu::avx2

#pragma GCC pop_options
#endif  // __x86_64__
