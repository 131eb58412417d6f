// Helpers and row/token tiling shared by the SIMD matmul files (included only inside their
// target-specific regions: matmul_avx2.cpp, matmul_quant_avx2.cpp, matmul_avx512.cpp;
// attention_avx2.cpp takes hsum). The
// f32/bf16 tiles use drive(); q8/q4 have their own loops in matmul_quant_avx2.cpp.
//
// A Tile type provides `template <int R, int T> static void run(w, r, x, t, y, ldy)`, computing
// the R×T outputs y[(t+j)*ldy + r+i]. drive() covers [r0, r1) × [0, n):
//   - decode (n == 1): 4 rows at a time; each weight row is streamed once (the tiles prefetch
//     two tiles ahead themselves).
//   - prefill: tokens in chunks of kTokenChunk (their activations stay in L2), and inside a
//     chunk 2-row × 4-token tiles, so a weight block is loaded once per 4 tokens from L1 and once
//     per chunk from memory; the next row pair is prefetched into L2 meanwhile.
#pragma once

#include <cstdint>

namespace kiln::engine::cpu::tiles {
// Internal linkage: each SIMD file compiles its own copy for its own target, so the linker never
// merges an AVX-512 copy into the AVX2 path.
namespace {

inline constexpr int64_t kTokenChunk = 64;

// Horizontal sum in a fixed order, ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)): part of
// the q8/q4 arithmetic's definition (matmul_ref.cpp), so every kernel must use this one.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Software prefetch of [p, p + bytes) into L1, one request per 64 bytes. Prefetching past the
// end of a matrix is harmless: prefetches never fault.
inline void prefetch_span(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

// Prefill: the next row pair's weights (2 KiB for K = 1024) are requested into L2 while the
// current pair runs its token tiles, so the tiles never wait on memory.
// `to_l1`: into L1 (about to be used) rather than L2.
inline void prefetch_rows(const WeightMatrix& w, int64_t r, int64_t n, bool to_l1 = false) {
  if (n <= 0) return;
  const char* p = reinterpret_cast<const char*>(w.row(r));
  const int64_t bytes = n * static_cast<int64_t>(w.stride());
  if (to_l1)
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
  else
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
}

template <class Tile, int R>
inline void tokens_for_rows(const WeightMatrix& w, int64_t r, const MatmulInput& x, int64_t t0,
                            int64_t t1, float* y, int64_t ldy) {
  int64_t t = t0;
  for (; t + 4 <= t1; t += 4) Tile::template run<R, 4>(w, r, x, t, y, ldy);
  for (; t < t1; ++t) Tile::template run<R, 1>(w, r, x, t, y, ldy);
}

template <class Tile>
inline void drive(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  if (x.n == 1) {
    // The tiles prefetch two tiles ahead of themselves; a thread's range starts cold, so its
    // first two tiles are requested here (a decode step runs hundreds of short ranges).
    prefetch_rows(w, r0, r1 - r0 < 8 ? r1 - r0 : 8, true);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) Tile::template run<4, 1>(w, r, x, 0, y, ldy);
    for (; r < r1; ++r) Tile::template run<1, 1>(w, r, x, 0, y, ldy);
    return;
  }
  for (int64_t t0 = 0; t0 < x.n; t0 += kTokenChunk) {
    const int64_t t1 = t0 + kTokenChunk < x.n ? t0 + kTokenChunk : x.n;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
      prefetch_rows(w, r + 2, r + 4 <= r1 ? 2 : r1 - r - 2);
      tokens_for_rows<Tile, 2>(w, r, x, t0, t1, y, ldy);
    }
    for (; r < r1; ++r) tokens_for_rows<Tile, 1>(w, r, x, t0, t1, y, ldy);
  }
}

}  // namespace
}  // namespace kiln::engine::cpu::tiles
