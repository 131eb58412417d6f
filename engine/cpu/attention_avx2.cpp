// Attention on AVX2 + FMA, as register-tiled products in flash attention's order: scores for a
// block of keys, online softmax (running max m, sum l, output rescaled when m rises), then the
// weighted values; the full score matrix never exists and every FMA does useful work.
//
// Prefill (prefill_attention_block): one call covers ~96 rows of one KV head
// (prefill_query_tokens); its rows are every (token, query head of that KV head's group), so all
// of them share each key and value row. Per block of 64 keys:
//   - scores: 3-row × 4-key register tiles, a dot product over D in 8 lanes each, reduced with
//     one hadd tree per row into its four scores. The key tile stays in L1 while every row
//     group passes over it.
//   - softmax: P = e^(S − m) eight lanes at a time (exp8), l = l·c + ΣP.
//   - values: 6-row × 16-column register tiles, O = c·O + Σ_j P[r][j]·V[j]; the 64 × 16 slab of
//     V stays in L1 while every row group passes over it. Twelve accumulators: with eight, each
//     waited on its own FMA latency every key (43 → 52-64 GFLOP/s on one thread).
// The previous kernel computed each score as a separate dot product that the compiler left
// scalar (a 4-cycle dependent FMA per element): a 4,096-token prefill spent ~27% of its time there.
//
// Decode (paged_attention_split): one call is one token's split of 256 keys over every KV head,
// a page (16 tokens) at a time: scores as 4-row × 2-key tiles, softmax, values as 16-column tiles
// of up to 4 rows. The next page's K and V blocks are prefetched a few lines per tile across the
// current page's work. Per-head items that fetched each page in bursts read the cache at ~8 GB/s;
// this reaches the weights' streaming rate (decode at 8k context 20 → 34 tok/s on the bench model).
#include "engine/cpu/attention_avx2.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cpu/matmul.h"  // simd_tiles.h names WeightMatrix

namespace kiln::engine::cpu::avx2 {
namespace {

constexpr int64_t kKeys = 64;      // keys per block; S rows are this long
constexpr int64_t kRowTile = 6;    // rows of a values tile
constexpr int64_t kScoreRows = 3;  // rows of a scores tile
constexpr int64_t kRowPad = 6;     // rows are padded to a multiple of both

// Per-thread scratch, grown on first use (defined outside the AVX2 region so no std:: template
// is instantiated with AVX2 code).
struct Scratch {
  float *q, *s, *o, *m, *l, *c;
};

Scratch scratch(int64_t rows, int64_t D) {
  thread_local std::vector<float> q, s, o, m, l, c;
  const auto R = static_cast<size_t>(rows), d = static_cast<size_t>(D);
  if (q.size() < R * d) q.resize(R * d), o.resize(R * d);
  if (s.size() < R * kKeys) s.resize(R * kKeys);
  if (m.size() < R) m.resize(R), l.resize(R), c.resize(R);
  return {q.data(), s.data(), o.data(), m.data(), l.data(), c.data()};
}

// Decode's per-thread scratch: the scaled query rows and one page of scores per row.
struct PagedScratch {
  float *q, *s;
};

PagedScratch paged_scratch(int64_t rows, int64_t D, int64_t page_tokens) {
  thread_local std::vector<float> q, s;
  if (q.size() < static_cast<size_t>(rows * D)) q.resize(static_cast<size_t>(rows * D));
  if (s.size() < static_cast<size_t>(rows * page_tokens)) s.resize(static_cast<size_t>(rows * page_tokens));
  return {q.data(), s.data()};
}

}  // namespace
}  // namespace kiln::engine::cpu::avx2

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "engine/cpu/simd_exp.h"
#include "engine/cpu/simd_tiles.h"

namespace kiln::engine::cpu::avx2 {
namespace {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

using tiles::hsum;

// Scores of rows q[0..2] against keys kp[0..3]: s[i][j..j+3] for row i. Three rows × four keys
// keep 12 accumulators (enough for the FMA latency) and load each K and q vector once per step.
inline void score_tile(const float* const* q, const float* const* kp, int D, float* const* s) {
  __m256 a[3][4];
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) a[r][i] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m256 x0 = _mm256_loadu_ps(q[0] + d), x1 = _mm256_loadu_ps(q[1] + d), x2 = _mm256_loadu_ps(q[2] + d);
    for (int i = 0; i < 4; ++i) {
      const __m256 kv = _mm256_loadu_ps(kp[i] + d);
      a[0][i] = _mm256_fmadd_ps(x0, kv, a[0][i]);
      a[1][i] = _mm256_fmadd_ps(x1, kv, a[1][i]);
      a[2][i] = _mm256_fmadd_ps(x2, kv, a[2][i]);
    }
  }
  // hadd tree: lane i of each 128-bit half = partial sum of key i; the halves are then added.
  for (int r = 0; r < 3; ++r) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]), _mm256_hadd_ps(a[r][2], a[r][3]));
    _mm_storeu_ps(s[r], _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
}

// ---- decode (paged cache) ---------------------------------------------------------------------
// Cache rows are f32 or bf16; both are read as 8 floats at a time.
struct F32Rows {
  static __m256 load8(const uint8_t* row, int64_t i) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i); }
  static constexpr int64_t kBytes = 4;
};
struct Bf16Rows {
  static __m256 load8(const uint8_t* row, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static constexpr int64_t kBytes = 2;
};

// Spreads the reads of the next page over the work on this one. A page holds one layer's K (and
// V) rows of every KV head as one contiguous block (page_tokens × row); asked for all at once its
// lines would fill the miss queues and stall the loop, and left to the hardware prefetcher
// (which stops at each 4 KiB page) the loop waits on memory at a third of the read bandwidth.
struct PagePrefetch {
  const char *k = nullptr, *v = nullptr;
  int64_t lines = 0, next = 0, per_pump = 0;
  void start(const uint8_t* kb, const uint8_t* vb, int64_t bytes, int64_t pumps) {
    k = reinterpret_cast<const char*>(kb), v = reinterpret_cast<const char*>(vb);
    lines = (bytes + 63) / 64, next = 0, per_pump = (lines + pumps - 1) / std::max<int64_t>(pumps, 1);
  }
  void pump() {
    for (const int64_t e = std::min(lines, next + per_pump); next < e; ++next) {
      _mm_prefetch(k + 64 * next, _MM_HINT_T0);
      _mm_prefetch(v + 64 * next, _MM_HINT_T0);
    }
  }
};

// Scores of NG query rows (q, stride D) against keys k0, k1: s[g·ls + j], s[g·ls + j + 1].
template <class Rows, int NG>
inline void paged_scores(const float* q, int D, const uint8_t* k0, const uint8_t* k1, float* s, int64_t ls,
                         bool second) {
  __m256 a[2][NG];
  for (int g = 0; g < NG; ++g) a[0][g] = a[1][g] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m256 x0 = Rows::load8(k0, d), x1 = Rows::load8(k1, d);
    for (int g = 0; g < NG; ++g) {
      const __m256 qg = _mm256_loadu_ps(q + g * D + d);
      a[0][g] = _mm256_fmadd_ps(qg, x0, a[0][g]);
      a[1][g] = _mm256_fmadd_ps(qg, x1, a[1][g]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    s[g * ls] = hsum(a[0][g]);
    if (second) s[g * ls + 1] = hsum(a[1][g]);
  }
}

// acc_g = c_g·acc_g + Σ_j p[g][j]·V[j] for NG rows, 16 columns at a time (acc_g at part +
// g·(D+2)): two vectors per row, so up to 8 accumulators cover the FMA latency.
template <class Rows, int NG>
inline void paged_values(const float* p, int64_t ls, const uint8_t* const* vrows, int64_t cnt, int D,
                         const float* c, float* part, PagePrefetch& pf) {
  for (int d = 0; d < D; d += 16) {
    pf.pump();
    __m256 acc[NG][2];
    for (int g = 0; g < NG; ++g) {
      const __m256 cg = _mm256_set1_ps(c[g]);
      acc[g][0] = _mm256_mul_ps(cg, _mm256_loadu_ps(part + g * (D + 2) + d));
      acc[g][1] = _mm256_mul_ps(cg, _mm256_loadu_ps(part + g * (D + 2) + d + 8));
    }
    for (int64_t j = 0; j < cnt; ++j) {
      const __m256 v0 = Rows::load8(vrows[j], d), v1 = Rows::load8(vrows[j], d + 8);
      for (int g = 0; g < NG; ++g) {
        const __m256 pj = _mm256_broadcast_ss(p + g * ls + j);
        acc[g][0] = _mm256_fmadd_ps(pj, v0, acc[g][0]);
        acc[g][1] = _mm256_fmadd_ps(pj, v1, acc[g][1]);
      }
    }
    for (int g = 0; g < NG; ++g) {
      _mm256_storeu_ps(part + g * (D + 2) + d, acc[g][0]);
      _mm256_storeu_ps(part + g * (D + 2) + d + 8, acc[g][1]);
    }
  }
}

// NG query rows of one KV head against one page's cnt keys: scores, online softmax, values.
// kp, vp: the head's first K and V row in the page; rows are row_bytes apart.
template <class Rows, int NG>
void page_rows(const float* q, const uint8_t* kp, const uint8_t* vp, int64_t row_bytes, int64_t cnt, int D,
               float* s, int64_t ls, float* part, PagePrefetch& pf) {
  for (int64_t j = 0; j < cnt; j += 2) {
    pf.pump();
    const uint8_t* k0 = kp + j * row_bytes;
    paged_scores<Rows, NG>(q, D, k0, j + 1 < cnt ? k0 + row_bytes : k0, s + j, ls, j + 1 < cnt);
  }
  alignas(32) float c[NG];
  for (int g = 0; g < NG; ++g) {
    float* sg = s + g * ls;
    float* st = part + g * (D + 2);  // acc[D], m, l
    float bm = -INFINITY;
    for (int64_t j = 0; j < cnt; ++j) bm = std::max(bm, sg[j]);
    const float m_new = std::max(st[D], bm);
    c[g] = std::exp(st[D] - m_new);  // 0 on the first page (m = −∞)
    st[D] = m_new;
    const __m256 m8 = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= cnt; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j), m8));
      _mm256_storeu_ps(sg + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    float tail = 0.0f;
    if (j < cnt) {
      alignas(32) float buf[8];
      for (int i = 0; i < 8; ++i) buf[i] = j + i < cnt ? sg[j + i] - m_new : -INFINITY;
      _mm256_store_ps(buf, exp8(_mm256_load_ps(buf)));
      for (int64_t i = 0; j + i < cnt; ++i) tail += (sg[j + i] = buf[i]);
    }
    st[D + 1] = st[D + 1] * c[g] + (hsum(sum) + tail);
  }
  const uint8_t* vrows[64];
  for (int64_t j0 = 0; j0 < cnt; j0 += 64) {  // pages are 16 tokens by default; any size works
    const int64_t n = std::min<int64_t>(64, cnt - j0);
    for (int64_t j = 0; j < n; ++j) vrows[j] = vp + (j0 + j) * row_bytes;
    alignas(32) float c1[NG];
    for (int g = 0; g < NG; ++g) c1[g] = j0 == 0 ? c[g] : 1.0f;
    paged_values<Rows, NG>(s + j0, ls, vrows, n, D, c1, part, pf);
  }
}

template <class Rows>
void paged_split(const float* q, const ops::PagedKv& kv, int Hkv, int group, int D, int64_t k_begin, int64_t k_end,
                 float* s, float* part0, int64_t kh_stride) {
  const int64_t P = kv.page_tokens, ls = P, row_bytes = kv.row * Rows::kBytes;
  const int64_t row_groups = (group + 3) / 4;
  for (int64_t p0 = k_begin; p0 < k_end; p0 += P) {
    const int64_t cnt = std::min(P, k_end - p0);
    const uint8_t* kp = kv.k_pages[p0 / P];
    const uint8_t* vp = kv.v_pages[p0 / P];
    PagePrefetch pf;
    if (p0 == k_begin) {  // the split's first page: nothing brought it in
      pf.start(kp, vp, cnt * row_bytes, 1);
      pf.pump();
    }
    if (p0 + P < k_end)
      pf.start(kv.k_pages[p0 / P + 1], kv.v_pages[p0 / P + 1], std::min(P, k_end - p0 - P) * row_bytes,
               Hkv * row_groups * ((cnt + 1) / 2 + D / 16));
    for (int kh = 0; kh < Hkv; ++kh) {
      const int64_t head = int64_t(kh) * D * Rows::kBytes;
      for (int g0 = 0; g0 < group; g0 += 4) {  // rows four at a time: 8 score accumulators
        const int64_t r = int64_t(kh) * group + g0;
        const float* qr = q + r * D;
        float* sr = s + r * ls;
        float* pr = part0 + kh * kh_stride + int64_t(g0) * (D + 2);
        switch (std::min(4, group - g0)) {
          case 4: page_rows<Rows, 4>(qr, kp + head, vp + head, row_bytes, cnt, D, sr, ls, pr, pf); break;
          case 3: page_rows<Rows, 3>(qr, kp + head, vp + head, row_bytes, cnt, D, sr, ls, pr, pf); break;
          case 2: page_rows<Rows, 2>(qr, kp + head, vp + head, row_bytes, cnt, D, sr, ls, pr, pf); break;
          default: page_rows<Rows, 1>(qr, kp + head, vp + head, row_bytes, cnt, D, sr, ls, pr, pf); break;
        }
      }
    }
  }
}

}  // namespace

void paged_attention_split(const float* q, const ops::PagedKv& kv, int Hkv, int group, int D, float scale,
                           int64_t k_begin, int64_t k_end, float* part, int64_t kh_stride) {
  const int64_t rows = int64_t(Hkv) * group;
  const PagedScratch w = paged_scratch(rows, D, kv.page_tokens);
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < rows * D; i += 8) _mm256_storeu_ps(w.q + i, _mm256_mul_ps(sc, _mm256_loadu_ps(q + i)));
  for (int kh = 0; kh < Hkv; ++kh)
    for (int g = 0; g < group; ++g) {
      float* st = part + kh * kh_stride + int64_t(g) * (D + 2);
      std::fill(st, st + D, 0.0f);
      st[D] = -INFINITY, st[D + 1] = 0.0f;
    }
  if (k_begin >= k_end) return;
  if (kv.bf16) paged_split<Bf16Rows>(w.q, kv, Hkv, group, D, k_begin, k_end, w.s, part, kh_stride);
  else paged_split<F32Rows>(w.q, kv, Hkv, group, D, k_begin, k_end, w.s, part, kh_stride);
}

void prefill_attention_block(const PrefillAttention& a, int kh, int64_t t0, int64_t nt) {
  const int group = a.Hq / a.Hkv, D = a.D;
  const int64_t R = nt * group, Rp = (R + kRowPad - 1) / kRowPad * kRowPad;
  const Scratch w = scratch(Rp, D);
  // Row r = (token t0 + r / group, query head kh·group + r % group); padded rows are zero and
  // see no key. Queries are pre-scaled so a score is one dot product.
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t r = 0; r < Rp; ++r) {
    float* qr = w.q + r * D;
    const float* src = r < R ? a.q + ((t0 + r / group) * a.Hq + int64_t(kh) * group + r % group) * D : nullptr;
    for (int d = 0; d < D; d += 8)
      _mm256_storeu_ps(qr + d, src ? _mm256_mul_ps(_mm256_loadu_ps(src + d), scale) : _mm256_setzero_ps());
    std::fill(w.o + r * D, w.o + (r + 1) * D, 0.0f);
    w.m[r] = -INFINITY, w.l[r] = 0.0f;
  }
  const int64_t base = a.n_kv - a.T;      // query t sees keys 0..base + t
  const int64_t n_keys = base + t0 + nt;  // the last row sees keys 0..n_keys − 1
  const int64_t kv_stride = int64_t(a.Hkv) * D;
  const float* const k0 = a.k + int64_t(kh) * D;
  const float* const v0 = a.v + int64_t(kh) * D;
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    const int64_t jn = std::min(kKeys, n_keys - j0);
    // Scores. Past the block's last key the tile repeats that key; those lanes are masked below.
    for (int64_t j = 0; j < jn; j += 4) {
      const float* kp[4];
      for (int i = 0; i < 4; ++i) kp[i] = k0 + (j0 + std::min<int64_t>(j + i, jn - 1)) * kv_stride;
      for (int64_t r = 0; r < Rp; r += kScoreRows) {
        const float* qr[3] = {w.q + r * D, w.q + (r + 1) * D, w.q + (r + 2) * D};
        float* sr[3] = {w.s + r * kKeys + j, w.s + (r + 1) * kKeys + j, w.s + (r + 2) * kKeys + j};
        score_tile(qr, kp, D, sr);
      }
    }
    // Online softmax; P overwrites S, zero past each row's last visible key.
    for (int64_t r = 0; r < Rp; ++r) {
      float* sr = w.s + r * kKeys;
      const int64_t visible = r < R ? std::clamp<int64_t>(base + t0 + r / group - j0 + 1, 0, jn) : 0;
      if (visible == 0) {  // the whole block is in this row's future
        std::fill(sr, sr + kKeys, 0.0f);
        w.c[r] = 1.0f;
        continue;
      }
      __m256 mx = _mm256_set1_ps(-INFINITY);
      int64_t j = 0;
      for (; j + 8 <= visible; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sr + j));
      float bm = hmax(mx);
      for (; j < visible; ++j) bm = std::max(bm, sr[j]);
      const float m_new = std::max(w.m[r], bm);
      w.c[r] = std::exp(w.m[r] - m_new);  // 0 on the row's first block (m = −∞)
      w.m[r] = m_new;
      const __m256 m8 = _mm256_set1_ps(m_new);
      __m256 sum = _mm256_setzero_ps();
      for (j = 0; j < kKeys; j += 8) {
        const __m256 lane = _mm256_add_ps(_mm256_set1_ps(float(j)), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 keep = _mm256_cmp_ps(lane, _mm256_set1_ps(float(visible)), _CMP_LT_OQ);
        const __m256 p = _mm256_and_ps(keep, exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), m8)));
        _mm256_storeu_ps(sr + j, p);
        sum = _mm256_add_ps(sum, p);
      }
      w.l[r] = w.l[r] * w.c[r] + hsum(sum);
    }
    // Values: O = c·O + P·V.
    for (int d = 0; d < D; d += 16) {
      for (int64_t r = 0; r < Rp; r += kRowTile) {
        __m256 acc[kRowTile][2];
        for (int i = 0; i < kRowTile; ++i) {
          const __m256 c = _mm256_set1_ps(w.c[r + i]);
          float* o = w.o + (r + i) * D + d;
          acc[i][0] = _mm256_mul_ps(c, _mm256_loadu_ps(o));
          acc[i][1] = _mm256_mul_ps(c, _mm256_loadu_ps(o + 8));
        }
        const float* p = w.s + r * kKeys;
        for (int64_t j = 0; j < jn; ++j) {
          const float* vj = v0 + (j0 + j) * kv_stride + d;
          const __m256 x0 = _mm256_loadu_ps(vj), x1 = _mm256_loadu_ps(vj + 8);
          for (int i = 0; i < kRowTile; ++i) {
            const __m256 pj = _mm256_broadcast_ss(p + i * kKeys + j);
            acc[i][0] = _mm256_fmadd_ps(pj, x0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(pj, x1, acc[i][1]);
          }
        }
        for (int i = 0; i < kRowTile; ++i) {
          float* o = w.o + (r + i) * D + d;
          _mm256_storeu_ps(o, acc[i][0]);
          _mm256_storeu_ps(o + 8, acc[i][1]);
        }
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const __m256 inv = _mm256_set1_ps(1.0f / w.l[r]);
    float* out = a.out + ((t0 + r / group) * a.Hq + int64_t(kh) * group + r % group) * D;
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(inv, _mm256_loadu_ps(w.o + r * D + d)));
  }
}

}  // namespace kiln::engine::cpu::avx2

#pragma GCC pop_options
#endif  // __x86_64__
