// AVX-512 kernel table: q8 and q4 products on AVX-512 VNNI (vpdpwssd: sixteen int16 pair products
// summed into int32 lanes in one instruction, where AVX2 needs vpmaddwd + vpaddd on half the
// width). f32/bf16 products and the quantizers are the AVX2 table's: decode of those is bound by
// memory, and they are not the serving formats. Offered when the CPU has AVX-512 F/BW/VL and VNNI
// (Ice Lake, Sapphire Rapids, Zen 4 and later); without VNNI the AVX2 table is the better one.
//
// The arithmetic is matmul_ref.cpp's definition, bit for bit: the int32 block sums are exact
// however they are formed, and the float steps (one FMA per block into a_{b mod 8}, the fixed
// final fold) are the same operations in the same order, so a session's logits are the same on
// this table, on AVX2 and on the reference (KernelMatmul.*, Batched.*).
//
// Decode (1-4 tokens a pass): as on AVX2, quants in slot order (quant.h) put pair p of eight blocks in 16
// consecutive slots, so one 32-byte load holds pairs 2s and 2s+1 of a group: widened to int16,
// lanes 0-7 are pair 2s of the eight blocks and lanes 8-15 pair 2s+1, and vpdpwssd against the
// tokens' matching 32 activations accumulates each block's partial sums in two lanes. Eight such
// steps cover a group; its two halves add (exact) and one FMA with the eight scales folds it,
// for two tokens at once in one 512-bit vector (the fold was a third of a 4-token tile's
// instructions; kernels_bench 4096×1024, interleaved: 4 tokens 0.14-0.18 → 0.10-0.13 ms, 8
// tokens 0.26-0.42 → 0.19-0.24 ms). Five to eight tokens: two streaming passes of up to four
// over each 16 rows (the second from L1), and so on up to 32 tokens (q8) or 16 (q4): see
// kStreamPassTokens. One pass of 2 rows × 8 tokens or 1 × 8 was slower (0.31-0.89 ms at 8
// tokens): the tile's sums, activations and accumulators outgrow 32 registers. More tokens
// (prefill): the AVX2 kernel's int16 panel (16 rows × pair, one 512-bit vector), each token's
// column pair broadcast, 16 rows × 8 tokens per register tile.
#include <cstdint>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// GCC 12's own _mm512_cvtepi32_ps and _mm512_castps512_ps256 pass _mm512_undefined_ps() /
// _mm256_undefined_pd() as their unused merge source, which -W(maybe-)uninitialized reports at
// every use; nothing here reads an uninitialized value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "engine/cpu/quant_tiles_avx2.h"
#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu::avx512 {
namespace {

using namespace quant_tiles;
using tiles::hsum;  // the fixed final order of the definition
using tiles::prefetch_span;

// Pairs 2s and 2s+1 (s = 0..7) of the eight blocks of group g, widened to int16.
// kStreamPassTokens: up to this many tokens, passes of four over each 16 rows (the later ones from
// L1) beat unpacking the rows into int16 panels. kernels_bench 4096×1024, interleaved: q8 at 9-16
// tokens 0.26-0.51 ms against 0.49-0.72 with panels, at 32 0.77-1.13 against 1.20-1.26, at 64
// 1.9 against 1.7-3.6; q4 (whose nibbles every pass unpacks again) at 16 tokens 0.50-0.60
// against 0.70-0.98, at 24 even.
struct Q8x {
  using Base = Q8;
  static constexpr int64_t kStreamPassTokens = 32;
  static __m512i pairs(const uint8_t* q, int64_t g, int s) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 256 + s * 32)));
  }
};
struct Q4x {
  using Base = Q4;
  static constexpr int64_t kStreamPassTokens = 16;
  // A group's byte o holds slot o (low nibble) and o + 128 (high): steps 0-3 are low nibbles of
  // bytes 32s.., steps 4-7 the high nibbles of the same bytes.
  static __m512i pairs(const uint8_t* q, int64_t g, int s) {
    const __m512i v =
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 128 + (s & 3) * 32)));
    return s < 4 ? _mm512_and_si512(v, _mm512_set1_epi16(0x0f)) : _mm512_srli_epi16(v, 4);
  }
};

// The eight blocks' sums: lanes i and i + 8 both hold block i (exact int32 adds).
inline __m256i fold_halves(__m512i s) {
  return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

// Lanes i and i + 8 of a and of b folded (exact int32 adds): lanes 0-7 a's eight block sums,
// lanes 8-15 b's.
inline __m512i fold_pair(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xee));
}
inline __m512i join_halves(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 both_halves(__m256 v) {
  const __m256i i = _mm256_castps_si256(v);
  return _mm512_castsi512_ps(join_halves(i, i));
}
inline __m256 upper_half(__m512 v) { return _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)); }

// ---- decode: one to four tokens a pass, weights streamed once -----------------------------------
constexpr int64_t kPrefetchRows = 8;
// Prefetched lines per step for R rows: a q8 row is ~4.25 lines a group and a group is 8 steps,
// so R/2 lines a step keeps up, spread out (bursts stall the loads behind them).
template <int R>
constexpr int kLinesPerStep = R / 2 > 0 ? R / 2 : 1;

template <class F, int R, int NT>
inline void stream_tile(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r,
                        bool prefetch_ahead) {
  const int64_t k = w.cols, nb = k / kQuantBlock, groups = nb / 8;
  const int64_t stride = static_cast<int64_t>(w.stride());
  const uint16_t* d[R];
  const uint8_t* q[R];
  for (int i = 0; i < R; ++i) {
    d[i] = reinterpret_cast<const uint16_t*>(w.row(r + i));
    q[i] = F::Base::quants(w.row(r + i), nb);
  }
  const int16_t* xq[NT];
  const int32_t* xsum[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = x.q16.q + j * k;
    xsum[j] = x.q16.block_sum + j * nb;
  }
  // One row requests a block's worth of bytes a step; more rows, kLinesPerStep lines a step.
  const char* ahead = reinterpret_cast<const char*>(w.row(r)) + kPrefetchRows * stride;
  const int64_t ahead_lines = R > 1 && prefetch_ahead ? (R * stride + 63) / 64 : 0;
  const int64_t ahead_step = (stride + nb - 1) / nb;
  int64_t sent = 0;
  // Block partial sums fold two tokens at a time into one 512-bit vector: lanes 0-7 are token
  // 2p's a_0..a_7, lanes 8-15 token 2p+1's (the same exact int32 adds and the same FMA per lane
  // as a 256-bit vector per token, in half the instructions). An odd last token keeps 256 bits.
  constexpr int NP = NT / 2;
  constexpr bool kOdd = NT % 2 == 1;
  __m512 acc2[R][NP > 0 ? NP : 1];
  __m256 acc1[R];
  for (int i = 0; i < R; ++i) {
    for (int p = 0; p < NP; ++p) acc2[i][p] = _mm512_setzero_ps();
    acc1[i] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i sum[R][NT];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NT; ++j) sum[i][j] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      if constexpr (R == 1) {
        if (prefetch_ahead) _mm_prefetch(ahead + (g * 8 + s) * ahead_step, _MM_HINT_T0);
      } else {
        for (int l = 0; l < kLinesPerStep<R> && sent < ahead_lines; ++l)
          _mm_prefetch(ahead + 64 * sent++, _MM_HINT_T0);
      }
      __m512i xv[NT];
      for (int j = 0; j < NT; ++j)
        xv[j] = _mm512_loadu_si512(xq[j] + g * 256 + s * 32);
      for (int i = 0; i < R; ++i) {
        const __m512i wv = F::pairs(q[i], g, s);
        for (int j = 0; j < NT; ++j) sum[i][j] = _mm512_dpwssd_epi32(sum[i][j], wv, xv[j]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + 8 * g)));
      const __m512 dv2 = both_halves(dv);
      for (int p = 0; p < NP; ++p)
        acc2[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold_pair(sum[i][2 * p], sum[i][2 * p + 1])), dv2, acc2[i][p]);
      if constexpr (kOdd)
        acc1[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_halves(sum[i][NT - 1])), dv, acc1[i]);
      if constexpr (F::Base::kOffset) {
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + nb + 8 * g)));
        const __m512 mv2 = both_halves(mv);
        for (int p = 0; p < NP; ++p) {
          const __m512i xs = join_halves(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xsum[2 * p] + 8 * g)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xsum[2 * p + 1] + 8 * g)));
          acc2[i][p] = _mm512_fmadd_ps(mv2, _mm512_cvtepi32_ps(xs), acc2[i][p]);
        }
        if constexpr (kOdd)
          acc1[i] = _mm256_fmadd_ps(
              mv, _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xsum[NT - 1] + 8 * g))),
              acc1[i]);
      }
    }
  }
  for (; sent < ahead_lines; ++sent) _mm_prefetch(ahead + 64 * sent, _MM_HINT_T0);
  for (int i = 0; i < R; ++i) {
    __m256 acc[NT];
    for (int p = 0; p < NP; ++p) {
      acc[2 * p] = _mm512_castps512_ps256(acc2[i][p]);
      acc[2 * p + 1] = upper_half(acc2[i][p]);
    }
    if constexpr (kOdd) acc[NT - 1] = acc1[i];
    if (groups * 8 < nb) stream_tail<typename F::Base, NT>(d[i], q[i], nb, groups * 8, nb - groups * 8, xq, xsum, acc);
    for (int j = 0; j < NT; ++j) y[j * ldy + r + i] = x.q16.d[j] * hsum(acc[j]);
  }
}

// Rows per tile: R·NT accumulators + NT activation vectors + one weight vector of the 32.
template <int NT>
constexpr int kStreamRows = NT == 1 ? 2 : 4;

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

// ---- prefill: 16-row panels × tiles of up to 8 tokens ------------------------------------------
constexpr int kTokenTile = 8;

// One block of a panel (pair pr of 16 rows: one vector) × NT tokens into acc[NT]; token j's pair
// pr is the int32 at xt[j] + xo + kPairStride·pr.
template <int NT, int kPairStride>
inline void panel_block(const int16_t* wb, const int16_t* const* xt, int64_t xo, __m512i* acc) {
#pragma GCC unroll 4
  for (int pr = 0; pr < kQuantBlock / 2; ++pr) {
    const __m512i wv = _mm512_loadu_si512(wb + pr * 2 * kPanelRows);
    for (int j = 0; j < NT; ++j) {
      int32_t pair;
      std::memcpy(&pair, xt[j] + xo + kPairStride * pr, 4);
      acc[j] = _mm512_dpwssd_epi32(acc[j], wv, _mm512_set1_epi32(pair));
    }
  }
}

// One panel × NT tokens starting at t: rows [r, r + n) of those tokens.
template <class F, int NT>
void panel_tile(const QuantPanelScratch& p, const MatmulInput& x, int64_t t, float* y, int64_t ldy, int64_t r,
                int64_t n) {
  const int64_t k = x.k, nb = k / kQuantBlock;
  alignas(64) float a[NT][8][kPanelRows];  // a_j of every (token, row); blocks 0-7 start them
  if (nb < 8)
    for (int j = 0; j < NT; ++j)
      for (int64_t l = nb; l < 8; ++l) _mm512_store_ps(a[j][l], _mm512_setzero_ps());
  const int16_t* xt[NT];
  for (int j = 0; j < NT; ++j) xt[j] = x.q16.q + (t + j) * k;
  const int64_t grouped = nb & ~int64_t{7};
  for (int64_t b = 0; b < nb; ++b) {
    __m512i acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_si512();
    const int16_t* wb = p.w + b * (kQuantBlock * kPanelRows);
    // Pair pr of block b in the activations' slot order: 16 apart in a group, 2 apart after.
    if (b < grouped)
      panel_block<NT, 16>(wb, xt, (b >> 3) * 256 + (b & 7) * 2, acc);
    else
      panel_block<NT, 2>(wb, xt, b * kQuantBlock, acc);
    const int lane = static_cast<int>(b & 7);
    const __m512 d = _mm512_loadu_ps(p.d + b * kPanelRows);
    for (int j = 0; j < NT; ++j) {
      float* aj = a[j][lane];
      __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), d, b < 8 ? _mm512_setzero_ps() : _mm512_load_ps(aj));
      if constexpr (F::Base::kOffset)
        s = _mm512_fmadd_ps(_mm512_loadu_ps(p.m + b * kPanelRows),
                            _mm512_set1_ps(static_cast<float>(x.q16.block_sum[(t + j) * nb + b])), s);
      _mm512_store_ps(aj, s);
    }
  }
  const __mmask16 rows = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  for (int j = 0; j < NT; ++j) {
    const __m512 s0 = _mm512_add_ps(_mm512_load_ps(a[j][0]), _mm512_load_ps(a[j][4]));
    const __m512 s1 = _mm512_add_ps(_mm512_load_ps(a[j][1]), _mm512_load_ps(a[j][5]));
    const __m512 s2 = _mm512_add_ps(_mm512_load_ps(a[j][2]), _mm512_load_ps(a[j][6]));
    const __m512 s3 = _mm512_add_ps(_mm512_load_ps(a[j][3]), _mm512_load_ps(a[j][7]));
    const __m512 out = _mm512_mul_ps(_mm512_set1_ps(x.q16.d[t + j]),
                                     _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
    _mm512_mask_storeu_ps(y + (t + j) * ldy + r, rows, out);
  }
}

template <class F, int NT>
void panel_tail(const QuantPanelScratch& p, const MatmulInput& x, int64_t t, float* y, int64_t ldy, int64_t r,
                int64_t n) {
  if constexpr (NT > 0) {
    if (x.n - t == NT) return panel_tile<F, NT>(p, x, t, y, ldy, r, n);
    panel_tail<F, NT - 1>(p, x, t, y, ldy, r, n);
  }
}

template <class F>
void matmat(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const QuantPanelScratch p = quant_panel_scratch(w.cols);
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int64_t n = r1 - r < kPanelRows ? r1 - r : kPanelRows;
    unpack_panel<typename F::Base>(w, r, n, p);
    NextPanelPrefetch next(w, r + n, r1, x.n / kTokenTile);
    int64_t t = 0;
    for (; t + kTokenTile <= x.n; t += kTokenTile) {
      next.slice();
      panel_tile<F, kTokenTile>(p, x, t, y, ldy, r, n);
    }
    next.rest();
    panel_tail<F, kTokenTile - 1>(p, x, t, y, ldy, r, n);
  }
}

template <class F>
void dispatch(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (r1 <= r0 || x.n <= 0) return;
  static_assert(kQuantStreamMaxTokens == 4, "the cases below");
  if (x.n <= 4) return stream<F>(w, x, y, ldy, r0, r1, true, true);
  if (x.n <= F::kStreamPassTokens) {
    // Passes of up to four tokens over each 16 rows: the first streams them from memory
    // (prefetching ahead; only the first strip starts cold), the others read them from L1 and
    // request nothing.
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      const int64_t re = r + kPanelRows < r1 ? r + kPanelRows : r1;
      for (int64_t t = 0; t < x.n; t += 4) {
        const MatmulInput part = token_range(x, t, x.n - t < 4 ? x.n - t : 4);
        stream<F>(w, part, y + t * ldy, ldy, r, re, t == 0, t == 0 && r == r0);
      }
    }
    return;
  }
  matmat<F>(w, x, y, ldy, r0, r1);
}

void matmul_q8(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  dispatch<Q8x>(w, x, y, ldy, r0, r1);
}
void matmul_q4(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  dispatch<Q4x>(w, x, y, ldy, r0, r1);
}

}  // namespace
}  // namespace kiln::engine::cpu::avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // __x86_64__

namespace kiln::engine::cpu {

const KernelTable* kernels_avx512() {
#if defined(__x86_64__)
  static const KernelTable* table = []() -> const KernelTable* {
    const CpuFeatures& f = cpu_features();
    const KernelTable* avx2 = kernels_avx2();
    if (!f.has_avx512_set() || !f.avx512vnni || avx2 == nullptr) return nullptr;
    static KernelTable t = *avx2;
    t.name = "avx512";
    t.matmul[static_cast<int>(WeightFormat::q8)] = avx512::matmul_q8;
    t.matmul[static_cast<int>(WeightFormat::q4)] = avx512::matmul_q4;
    return &t;
  }();
  return table;
#else
  return nullptr;
#endif
}

}  // namespace kiln::engine::cpu
