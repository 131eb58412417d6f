// q8 and q4 products on AVX2: a streaming kernel for decode (one to four tokens: each weight
// block is read and widened once for all of them; five to eight in passes of three) and a
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
// Streaming (T ≤ 4): quants are in slot order (quant.h), so one 16-byte load per row holds pair p
// of eight blocks; vpmaddwd against the tokens' matching activation pairs leaves block 8g+i's
// partial sum in lane i, and after 16 pairs one FMA with the eight fp16 scales folds the group:
// the a_j are the lanes, with no horizontal sum. Tiles of R rows × T tokens share each load
// (~0.7 loads per multiply; on Zen 3 loads, not multiplies, bound this). Software prefetch runs
// 8 rows ahead (the hardware prefetcher alone leaves the stream at half the read bandwidth). For
// a few tokens this costs less than unpacking a panel (batched decode: most experts see one to
// three tokens).
//
// Five to eight tokens: streaming passes of up to three tokens per 16 rows (4-row tiles: ~0.6
// loads per multiply); the later passes read the rows from L1, so weights still leave memory
// once, and nothing is unpacked.
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

namespace kiln::engine::cpu {

// Defined outside the SIMD regions so no std:: template is instantiated with AVX2 code.
QuantPanelScratch quant_panel_scratch(int64_t k) {
  thread_local std::vector<int16_t> w;
  thread_local std::vector<float> d, m;
  const auto nb = static_cast<size_t>(k / kQuantBlock);
  const auto rows = static_cast<size_t>(kQuantPanelRows);
  if (w.size() < nb * kQuantBlock * rows) w.resize(nb * kQuantBlock * rows);
  if (d.size() < nb * rows) {
    d.resize(nb * rows);
    m.resize(nb * rows);
  }
  return {w.data(), d.data(), m.data()};
}

}  // namespace kiln::engine::cpu

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "engine/cpu/quant_tiles_avx2.h"
#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu::avx2 {
namespace {

using namespace quant_tiles;
using tiles::hsum;  // the fixed final order of the definition
using tiles::prefetch_span;

constexpr int kTokenTile = 4;


// ---- decode: one to four tokens, weights streamed once ----------------------------------------
// A tile of R rows × NT tokens runs each group of eight blocks pair by pair: one load of pair p
// (slot order) per row and one per token feed R·NT multiply-adds whose lanes are the eight blocks'
// partial sums, so after 16 pairs lane i holds s_{8g+i} exactly and one FMA with the eight scales
// folds the group into a_j. No horizontal sums, and ~0.7 loads per multiply (loads, not
// multiplies, bound these kernels on Zen 3: ~1 256-bit load a cycle against ~1.9 vpmaddwd).
// Trailing blocks (K not a multiple of 256) are natural order and go through stream_tail.
constexpr int64_t kPrefetchRows = 8;


template <int R>
constexpr int kPrefetchEvery = R >= 3 ? 1 : 2;  // R == 1 has its own pattern

// Rows [r, r + R) × NT tokens. With prefetch_ahead, the R rows kPrefetchRows further on are
// requested, even past the range or the matrix: prefetches never fault, and the memory after a
// range is usually read next (the next range of the split, the next expert's matrix).
template <class F, int R, int NT>
inline void stream_tile(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r,
                        bool prefetch_ahead) {
  const int64_t k = w.cols, nb = k / kQuantBlock, groups = nb / 8;
  const int64_t stride = static_cast<int64_t>(w.stride());
  const uint16_t* d[R];
  const uint8_t* q[R];
  for (int i = 0; i < R; ++i) {
    d[i] = reinterpret_cast<const uint16_t*>(w.row(r + i));
    q[i] = F::quants(w.row(r + i), nb);
  }
  const int16_t* xq[NT];
  const int32_t* xsum[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = x.q16.q + j * k;
    xsum[j] = x.q16.block_sum + j * nb;
  }
  // The R rows kPrefetchRows ahead are requested one line per pair step for three rows and
  // more, every second step for two; one row requests a block's worth of bytes every second step
  // (a group of one q8 row is 4.25 lines). Spread out: bursts of requests stall the loads
  // behind them.
  const char* ahead = reinterpret_cast<const char*>(w.row(r)) + kPrefetchRows * stride;
  const int64_t ahead_lines = R > 1 && prefetch_ahead ? (R * stride + 63) / 64 : 0;  // line by line
  const int64_t ahead_step = (stride + nb - 1) / nb;                                // one row: per block
  int64_t sent = 0;
  __m256 acc[R][NT];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i sum[R][NT];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NT; ++j) sum[i][j] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      if constexpr (R == 1) {
        // One row: a request per block's worth of bytes (~34 for q8: each line about twice).
        if (p % 2 == 0 && prefetch_ahead) _mm_prefetch(ahead + (g * 8 + p / 2) * ahead_step, _MM_HINT_T0);
      } else if (p % kPrefetchEvery<R> == 0 && sent < ahead_lines) {
        _mm_prefetch(ahead + 64 * sent++, _MM_HINT_T0);
      }
      __m256i xv[NT];
      for (int j = 0; j < NT; ++j)
        xv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[j] + g * 256 + p * 16));
      for (int i = 0; i < R; ++i) {
        const __m256i wv = F::group_pairs(q[i], g, p);
        for (int j = 0; j < NT; ++j) {
          sum[i][j] = _mm256_add_epi32(sum[i][j], _mm256_madd_epi16(wv, xv[j]));
          // Integer adds reassociate freely: without this GCC sums all 16 pairs' products as a
          // tree at the end, keeping every product live (spilled) instead of one running sum.
          asm("" : "+x"(sum[i][j]));
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + 8 * g)));
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][j]), dv, acc[i][j]);
      if constexpr (F::kOffset) {
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + nb + 8 * g)));
        for (int j = 0; j < NT; ++j)
          acc[i][j] = _mm256_fmadd_ps(
              mv, _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xsum[j] + 8 * g))), acc[i][j]);
      }
    }
  }
  for (; sent < ahead_lines; ++sent) _mm_prefetch(ahead + 64 * sent, _MM_HINT_T0);
  if (groups * 8 < nb)
    for (int i = 0; i < R; ++i) stream_tail<F, NT>(d[i], q[i], nb, groups * 8, nb - groups * 8, xq, xsum, acc[i]);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) y[j * ldy + r + i] = x.q16.d[j] * hsum(acc[i][j]);
}

// Rows per tile for NT tokens: R·NT accumulators, NT activation vectors and one weight vector,
// about the 16 registers (4 × 3 takes the third token's pairs from memory, and still ran ~1.3×
// the 3 × 3 tile in kernels_bench at 3 tokens). One token (decode, bound by memory) streams a
// row at a time: in kernels_bench four rows at once read no faster and sometimes slower.
template <int NT>
constexpr int kStreamRows = NT == 1 ? 1 : NT == 2 ? 4 : NT == 3 ? 4 : 2;

// Rows [r0, r1). A cold range requests its first rows at once; the tiles keep kPrefetchRows
// ahead unless told the rows are already in cache.
template <class F, int NT>
void matvec(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1,
            bool prefetch_ahead, bool cold) {
  constexpr int R = kStreamRows<NT>;
  const int64_t stride = static_cast<int64_t>(w.stride());
  if (cold)
    for (int64_t r = r0; r < r1 && r < r0 + kPrefetchRows; ++r) prefetch_span(w.row(r), stride);
  int64_t r = r0;
  for (; r + R <= r1; r += R) stream_tile<F, R, NT>(w, x, y, ldy, r, prefetch_ahead);
  for (; r < r1; ++r) stream_tile<F, 1, NT>(w, x, y, ldy, r, prefetch_ahead);
}

// ---- T > 4: panels of 16 rows × tiles of 4 tokens ---------------------------------------------


// One block of a panel × NT tokens into acc (rows 0-7 and 8-15); token j's pair pr is the
// int32 at xt[j] + xo + kPairStride·pr.
template <int NT, int kPairStride>
inline void panel_block(const int16_t* wb, const int16_t* const* xt, int64_t xo, __m256i (*acc)[NT]) {
#pragma GCC unroll 4
  for (int pr = 0; pr < kQuantBlock / 2; ++pr) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + pr * 2 * kPanelRows));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + pr * 2 * kPanelRows + 16));
    for (int j = 0; j < NT; ++j) {
      int32_t pair;
      std::memcpy(&pair, xt[j] + xo + kPairStride * pr, 4);
      const __m256i xv = _mm256_set1_epi32(pair);
      acc[0][j] = _mm256_add_epi32(acc[0][j], _mm256_madd_epi16(w0, xv));
      acc[1][j] = _mm256_add_epi32(acc[1][j], _mm256_madd_epi16(w1, xv));
    }
  }
}

// One panel × NT tokens starting at t. Writes rows [r, r + n) of those tokens.
template <class F, int NT>
void panel_tile(const QuantPanelScratch& p, const MatmulInput& x, int64_t t, float* y, int64_t ldy,
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
  const int64_t grouped = nb & ~int64_t{7};
  for (int64_t b = 0; b < nb; ++b) {
    __m256i acc[2][NT];
    for (int j = 0; j < NT; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_si256();
    const int16_t* wb = p.w + b * (kQuantBlock * kPanelRows);
    // Pair pr of block b in the activations' slot order: 16 apart in a group, 2 apart after.
    if (b < grouped)
      panel_block<NT, 16>(wb, xt, (b >> 3) * 256 + (b & 7) * 2, acc);
    else
      panel_block<NT, 2>(wb, xt, b * kQuantBlock, acc);
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
  const QuantPanelScratch p = quant_panel_scratch(w.cols);
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int64_t n = r1 - r < kPanelRows ? r1 - r : kPanelRows;
    unpack_panel<F>(w, r, n, p);
    NextPanelPrefetch next(w, r + n, r1, x.n / kTokenTile);
    int64_t t = 0;
    for (; t + kTokenTile <= x.n; t += kTokenTile) {
      next.slice();
      panel_tile<F, kTokenTile>(p, x, t, y, ldy, r, n);
    }
    next.rest();
    switch (x.n - t) {
      case 3: panel_tile<F, 3>(p, x, t, y, ldy, r, n); break;
      case 2: panel_tile<F, 2>(p, x, t, y, ldy, r, n); break;
      case 1: panel_tile<F, 1>(p, x, t, y, ldy, r, n); break;
      default: break;
    }
  }
}


template <class F>
void stream(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1,
            bool prefetch_ahead, bool cold) {
  switch (x.n) {
    case 1: return matvec<F, 1>(w, x, y, ldy, r0, r1, prefetch_ahead, cold);
    case 2: return matvec<F, 2>(w, x, y, ldy, r0, r1, prefetch_ahead, cold);
    case 3: return matvec<F, 3>(w, x, y, ldy, r0, r1, prefetch_ahead, cold);
    default: return matvec<F, 4>(w, x, y, ldy, r0, r1, prefetch_ahead, cold);
  }
}

template <class F>
void dispatch(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (r1 <= r0 || x.n <= 0) return;
  static_assert(kQuantStreamMaxTokens == 4, "the cases below");
  if (x.n <= 4) return stream<F>(w, x, y, ldy, r0, r1, true, true);
  if (x.n <= 8) {
    // Passes of up to three tokens over 16 rows at a time: the first prefetches ahead (only the
    // first strip starts cold), the others read the rows from L1 and request nothing (their
    // requests would only take load slots).
    const MatmulInput a = token_range(x, 0, 3), b = token_range(x, 3, x.n - 3 < 3 ? x.n - 3 : 3);
    const MatmulInput c = x.n > 6 ? token_range(x, 6, x.n - 6) : MatmulInput{};
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      const int64_t re = r + kPanelRows < r1 ? r + kPanelRows : r1;
      stream<F>(w, a, y, ldy, r, re, true, r == r0);
      stream<F>(w, b, y + 3 * ldy, ldy, r, re, false, false);
      if (c.n > 0) stream<F>(w, c, y + 6 * ldy, ldy, r, re, false, false);
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
