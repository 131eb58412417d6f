// Fast paths for matmul and attention: multithreaded over output rows / heads, weights read once
// per call. bf16/q8/q4 weights run the SIMD kernels of engine/cpu/matmul.h (tiled over tokens
// for T > 1); f32/f16 tiles of W are (widened to f32 once and) reused for all T tokens.
// Twins: matmul_ref, attention_ref in ops_ref.cpp.
#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include <immintrin.h>

#include "engine/cpu/attention_avx2.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/simd_exp.h"
#include "engine/ops.h"

namespace kiln::engine::ops {
namespace {

constexpr int64_t kTileRows = 4;

// Rows per work item of a kernel-table product: while the kernels stream rows, 4-row items; once
// the q8/q4 kernels unpack panels, an item must not cut one (see matmul.h).
constexpr int64_t kernel_tile_rows(int64_t T) {
  return T <= cpu::kQuantStreamMaxTokens ? kTileRows : cpu::kQuantPanelRows;
}

// Grouped products lay their jobs end to end in tile space: job i owns tiles
// [first_tile[i], first_tile[i+1]), kernel_tile_rows(T_i) rows each. Calls fn(i, r0, r1) for
// the rows of every job that the tiles [b, e) of one work item cover.
template <class RowsOf, class Fn>
void for_each_job_rows(const std::vector<int64_t>& first_tile, int64_t b, int64_t e, RowsOf rows_and_tokens,
                       Fn&& fn) {
  int i = int(std::upper_bound(first_tile.begin(), first_tile.end(), b) - first_tile.begin()) - 1;
  for (int64_t t = b; t < e; ++i) {
    const int64_t job_end = std::min(e, first_tile[size_t(i) + 1]);
    if (job_end <= t) continue;
    const auto [rows, T] = rows_and_tokens(i);
    const int64_t tile_rows = kernel_tile_rows(T);
    const int64_t r0 = (t - first_tile[size_t(i)]) * tile_rows;
    const int64_t r1 = std::min(rows, (job_end - first_tile[size_t(i)]) * tile_rows);
    fn(i, r0, r1);
    t = job_end;
  }
}

// The inputs of a grouped product, prepared once per distinct (x, T, K, block format): jobs
// reading the same activations (q/k/v, gate/up, a decode step's experts) share one quantization,
// a pure function of x, so the products are unchanged. Kept per calling thread and reused (the
// deque keeps earlier buffers in place as it grows, so inputs handed out stay valid).
class SharedInputs {
 public:
  void clear() { prepared_.clear(); }
  cpu::MatmulInput get(const cpu::KernelTable& kt, cpu::WeightFormat f, const float* x, int64_t T, int64_t K) {
    const bool block = cpu::is_block_format(f);
    for (const Prepared& p : prepared_)
      if (p.x == x && p.T == T && p.K == K && p.block == block) return p.in;
    if (acts_.size() <= prepared_.size()) acts_.emplace_back();
    const cpu::MatmulInput in = cpu::prepare_input(kt, f, x, T, K, acts_[prepared_.size()]);
    prepared_.push_back({x, T, K, block, in});
    return in;
  }

 private:
  struct Prepared {
    const float* x;
    int64_t T, K;
    bool block;  // q8/q4 read int16 activations, bf16 the f32 rows themselves
    cpu::MatmulInput in;
  };
  std::deque<cpu::ActQ16Buffer> acts_;
  std::vector<Prepared> prepared_;
};

// Four dot products sharing the loads of x.
inline void dot4(const float* x, const float* w, int64_t K, float* s) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < K; ++i) {
    const float xi = x[i];
    s0 += xi * w0[i];
    s1 += xi * w1[i];
    s2 += xi * w2[i];
    s3 += xi * w3[i];
  }
  s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

inline float dot(const float* x, const float* w, int64_t K) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < K; ++i) s += x[i] * w[i];
  return s;
}

// bf16, q8 and q4 weights go to the kernel tables of engine/cpu/matmul.h (SIMD chosen by
// CPUID; activations quantized to int16 once per call for q8/q4); f32 and f16 take this
// widening path.
void matmul_widening(ThreadPool* pool, const float* x, int64_t T, const Matrix& w, float* y) {
  const int64_t N = w.rows, K = w.cols;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  auto work = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> buf;
    buf.resize(size_t(kTileRows * K));
    for (int64_t tile = b; tile < e; ++tile) {
      const int64_t r0 = tile * kTileRows, nr = std::min(kTileRows, N - r0);
      const float* wt;
      if (w.dtype == Dtype::f32) {
        wt = reinterpret_cast<const float*>(w.row_ptr(r0));
      } else {
        to_f32(w.dtype, w.row_ptr(r0), buf.data(), nr * K);
        wt = buf.data();
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * K;
        float* yt = y + t * N + r0;
        if (nr == kTileRows) {
          dot4(xt, wt, K, yt);
        } else {
          for (int64_t r = 0; r < nr; ++r) yt[r] = dot(xt, wt + r * K, K);
        }
      }
    }
  };
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, K * T * kTileRows));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

// f32 weights (test checkpoints) keep the sequential-sum widening path: the prefill/decode
// consistency margins of tests/engine/consistency_test.cpp were measured with its rounding, and
// no served model stores f32 matrices. The f32 kernels stay tested in kernel_matmul_test.cpp.
std::optional<cpu::WeightFormat> kernel_format(Dtype d) {
  switch (d) {
    case Dtype::bf16: return cpu::WeightFormat::bf16;
    case Dtype::q8: return cpu::WeightFormat::q8;
    case Dtype::q4: return cpu::WeightFormat::q4;
    default: return std::nullopt;
  }
}

}  // namespace

void matmul(ThreadPool* pool, const float* x, int64_t T, const Matrix& w, float* y) {
  const auto format = kernel_format(w.dtype);
  if (!format) return matmul_widening(pool, x, T, w, y);
  const cpu::KernelTable& kt = cpu::kernels_best();
  const cpu::WeightMatrix wm{*format, w.rows, w.cols, static_cast<const uint8_t*>(w.data)};
  // Owned by the calling thread; grows to the largest input once, then is reused (no allocation
  // per call in steady state).
  thread_local cpu::ActQ16Buffer acts;
  const cpu::MatmulInput in = cpu::prepare_input(kt, *format, x, T, w.cols, acts);
  const cpu::MatmulFn fn = kt.matmul[int(*format)];
  const int64_t tile_rows = kernel_tile_rows(T);
  const int64_t tiles = (w.rows + tile_rows - 1) / tile_rows;
  auto work = [&](int64_t b, int64_t e) {
    fn(wm, in, y, w.rows, b * tile_rows, std::min(w.rows, e * tile_rows));
  };
  // Grain: enough rows that a chunk is worth a hand-off (~64K multiply-adds).
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, w.cols * T * tile_rows));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

void matmul_group(ThreadPool* pool, const MatmulJob* jobs, int n_jobs) {
  const cpu::KernelTable& kt = cpu::kernels_best();
  // Per calling thread, reused: the prepared inputs, prefix sums of row tiles.
  // (The workers must see the caller's instances: named through references, never directly.)
  thread_local SharedInputs shared_tls;
  thread_local std::vector<cpu::MatmulInput> inputs_tls;
  thread_local std::vector<int64_t> first_tile_tls;
  SharedInputs& shared = shared_tls;
  std::vector<cpu::MatmulInput>& inputs = inputs_tls;
  std::vector<int64_t>& first_tile = first_tile_tls;
  shared.clear();
  inputs.assign(size_t(n_jobs), {});
  first_tile.assign(size_t(n_jobs) + 1, 0);
  int64_t macs = 0;
  for (int i = 0; i < n_jobs; ++i) {
    const MatmulJob& j = jobs[i];
    if (!kernel_format(j.w->dtype)) {  // f32/f16: no grouped kernel, run it on its own
      matmul(pool, j.x, j.T, *j.w, j.y);
      first_tile[size_t(i) + 1] = first_tile[size_t(i)];
      continue;
    }
    inputs[size_t(i)] = shared.get(kt, *kernel_format(j.w->dtype), j.x, j.T, j.w->cols);
    const int64_t tile_rows = kernel_tile_rows(j.T);
    first_tile[size_t(i) + 1] = first_tile[size_t(i)] + (j.w->rows + tile_rows - 1) / tile_rows;
    macs += j.w->rows * j.w->cols * j.T;
  }
  const int64_t tiles = first_tile[size_t(n_jobs)];
  if (tiles == 0) return;
  auto work = [&](int64_t b, int64_t e) {
    for_each_job_rows(first_tile, b, e, [&](int i) { return std::pair{jobs[i].w->rows, jobs[i].T}; },
                      [&](int i, int64_t r0, int64_t r1) {
                        const MatmulJob& j = jobs[i];
                        const cpu::WeightFormat f = *kernel_format(j.w->dtype);
                        const cpu::WeightMatrix wm{f, j.w->rows, j.w->cols, static_cast<const uint8_t*>(j.w->data)};
                        kt.matmul[int(f)](wm, inputs[size_t(i)], j.y, j.w->rows, r0, r1);
                      });
  };
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, macs / tiles));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

void matmul_swiglu_group(ThreadPool* pool, const SwigluJob* jobs, int n_jobs) {
  auto unfused = [&] {  // f32/f16 weights (test checkpoints): the plain sequence
    for (int i = 0; i < n_jobs; ++i) {
      const SwigluJob& j = jobs[i];
      if (!j.up) {
        matmul(pool, j.x, j.T, *j.gate, j.g);
        continue;
      }
      const MatmulJob gu[] = {{j.gate, j.x, j.T, j.g}, {j.up, j.x, j.T, j.u}};
      matmul_group(pool, gu, 2);
      const int64_t I = j.gate->rows;
      silu_mul(j.g, I, j.u, I, j.T, I, j.h);
    }
  };
  for (int i = 0; i < n_jobs; ++i)
    if (!kernel_format(jobs[i].gate->dtype) || (jobs[i].up && !kernel_format(jobs[i].up->dtype))) return unfused();
  const cpu::KernelTable& kt = cpu::kernels_best();
  // Per calling thread, reused (workers name them through these references, never directly).
  thread_local SharedInputs shared_tls;
  thread_local std::vector<cpu::MatmulInput> gate_in_tls, up_in_tls;
  thread_local std::vector<int64_t> first_tile_tls;
  SharedInputs& shared = shared_tls;
  std::vector<cpu::MatmulInput>&gate_in = gate_in_tls, &up_in = up_in_tls;
  std::vector<int64_t>& first_tile = first_tile_tls;
  shared.clear();
  gate_in.assign(size_t(n_jobs), {}), up_in.assign(size_t(n_jobs), {});
  first_tile.assign(size_t(n_jobs) + 1, 0);
  int64_t macs = 0;
  for (int i = 0; i < n_jobs; ++i) {
    const SwigluJob& j = jobs[i];
    gate_in[size_t(i)] = shared.get(kt, *kernel_format(j.gate->dtype), j.x, j.T, j.gate->cols);
    if (j.up) up_in[size_t(i)] = shared.get(kt, *kernel_format(j.up->dtype), j.x, j.T, j.up->cols);
    const int64_t tile_rows = kernel_tile_rows(j.T);
    first_tile[size_t(i) + 1] = first_tile[size_t(i)] + (j.gate->rows + tile_rows - 1) / tile_rows;
    macs += (j.up ? 2 : 1) * j.gate->rows * j.gate->cols * j.T;
  }
  const int64_t tiles = first_tile[size_t(n_jobs)];
  if (tiles == 0) return;
  auto work = [&](int64_t b, int64_t e) {
    for_each_job_rows(first_tile, b, e, [&](int i) { return std::pair{jobs[i].gate->rows, jobs[i].T}; },
                      [&](int i, int64_t r0, int64_t r1) {
                        const SwigluJob& j = jobs[i];
                        const int64_t I = j.gate->rows;
                        const cpu::WeightFormat fg = *kernel_format(j.gate->dtype);
                        const cpu::WeightMatrix wg{fg, I, j.gate->cols, static_cast<const uint8_t*>(j.gate->data)};
                        kt.matmul[int(fg)](wg, gate_in[size_t(i)], j.g, I, r0, r1);
                        if (!j.up) return;  // a plain product riding along in the section
                        const cpu::WeightFormat fu = *kernel_format(j.up->dtype);
                        const cpu::WeightMatrix wu{fu, j.up->rows, j.up->cols, static_cast<const uint8_t*>(j.up->data)};
                        kt.matmul[int(fu)](wu, up_in[size_t(i)], j.u, I, r0, r1);
                        for (int64_t tok = 0; tok < j.T; ++tok)
                          silu_mul(j.g + tok * I + r0, I, j.u + tok * I + r0, I, 1, r1 - r0, j.h + tok * I + r0);
                      });
  };
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, macs / tiles));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

namespace {

// silu(g)·u, eight lanes at a time with a vector e^x (libm's scalar expf was 2-4% of a prefill).
// A row's last few elements go through the same vector code (padded), so every element is
// computed alike wherever a caller's row range happens to split (batched = solo, bit for bit).
__attribute__((target("avx2,fma"))) inline __m256 silu_mul8(__m256 x, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, cpu::exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
  return _mm256_mul_ps(_mm256_mul_ps(x, s), u);
}

// One row: out[i] = silu(g[i])·u[i] (u == nullptr: ·1). out may alias g.
__attribute__((target("avx2,fma"))) void silu_row_avx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(g + i), u ? _mm256_loadu_ps(u + i) : one));
  if (i == n) return;
  alignas(32) float gt[8] = {}, ut[8] = {};
  for (int64_t k = 0; k < n - i; ++k) gt[k] = g[i + k], ut[k] = u ? u[i + k] : 1.0f;
  _mm256_store_ps(gt, silu_mul8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
  for (int64_t k = 0; k < n - i; ++k) out[i + k] = gt[k];
}

}  // namespace

void silu_inplace(float* x, int64_t n) {
  if (cpu::cpu_features().has_avx2_set()) return silu_row_avx2(x, nullptr, x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
}

void silu_mul(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, int64_t rows, int64_t n,
              float* y) {
  if (cpu::cpu_features().has_avx2_set()) {
    for (int64_t r = 0; r < rows; ++r) silu_row_avx2(gate + r * g_stride, up + r * u_stride, y + r * n, n);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = silu(gate[r * g_stride + i]) * up[r * u_stride + i];
}

namespace {

struct AttentionArgs {
  const float *q, *k, *v;
  int64_t T, n_kv;
  int Hq, Hkv, D;
  float scale;
  float* out;
};

// Portable prefill attention (CPUs without AVX2, or head sizes attention_avx2 does not take),
// blocked like flash attention so each K/V row is read once per block of queries instead of once
// per query row (a 512-token chunk over an 8k context otherwise streams ~16 MB of K/V from
// memory for each of its 4,096 (token, head) rows). An item is one KV head and
// up to kQueryBlock tokens: its rows are every (token, query head of that KV head's group), so
// group·kQueryBlock rows share each key and value row while it sits in L1. Keys come in blocks of
// kKeyBlock with an online softmax (running max m, sum l, output acc rescaled when the max
// rises); the full score matrix never exists.
constexpr int64_t kQueryBlock = 16, kKeyBlock = 64;

struct AttentionScratch {
  std::vector<float> s, acc, m, l;
};

void attention_block(const AttentionArgs& a, int64_t item, AttentionScratch& w) {
  const int group = a.Hq / a.Hkv, D = a.D;
  const int64_t n_tb = (a.T + kQueryBlock - 1) / kQueryBlock;
  const int kh = int(item / n_tb);
  const int64_t t0 = (item % n_tb) * kQueryBlock, nt = std::min(kQueryBlock, a.T - t0);
  const int64_t R = nt * group;  // row r = (token t0 + r / group, head kh·group + r % group)
  w.s.resize(size_t(R * kKeyBlock)), w.acc.assign(size_t(R * D), 0.0f);
  w.m.assign(size_t(R), -INFINITY), w.l.assign(size_t(R), 0.0f);
  auto qrow = [&](int64_t r) { return a.q + ((t0 + r / group) * a.Hq + kh * group + r % group) * D; };
  const int64_t base = a.n_kv - a.T;         // query t sees keys 0..base + t
  const int64_t n_keys = base + t0 + nt;     // the block's last row sees keys 0..n_keys − 1
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const int64_t jn = std::min(kKeyBlock, n_keys - j0);
    for (int64_t j = 0; j < jn; ++j) {  // scores: each key row once for all R query rows
      const float* kj = a.k + ((j0 + j) * a.Hkv + kh) * D;
      for (int64_t r = 0; r < R; ++r) {
        const bool visible = j0 + j <= base + t0 + r / group;
        w.s[size_t(r * kKeyBlock + j)] = visible ? dot(qrow(r), kj, D) * a.scale : -INFINITY;
      }
    }
    for (int64_t r = 0; r < R; ++r) {  // online softmax per row
      float* sr = &w.s[size_t(r * kKeyBlock)];
      float bm = -INFINITY;
      for (int64_t j = 0; j < jn; ++j) bm = std::max(bm, sr[j]);
      if (bm == -INFINITY) {  // the whole block is in this row's future: no weight
        std::fill(sr, sr + jn, 0.0f);
        continue;
      }
      float& m = w.m[size_t(r)];
      if (bm > m) {
        const float c = std::exp(m - bm);  // 0 on the row's first block
        w.l[size_t(r)] *= c;
        float* acc = &w.acc[size_t(r * D)];
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[d] *= c;
        m = bm;
      }
      float sum = 0;
      for (int64_t j = 0; j < jn; ++j) sum += (sr[j] = std::exp(sr[j] - m));  // exp(−inf) = 0
      w.l[size_t(r)] += sum;
    }
    for (int64_t j = 0; j < jn; ++j) {  // weighted values: each value row once for all R rows
      const float* vj = a.v + ((j0 + j) * a.Hkv + kh) * D;
      for (int64_t r = 0; r < R; ++r) {
        const float p = w.s[size_t(r * kKeyBlock + j)];
        if (p == 0.0f) continue;
        float* acc = &w.acc[size_t(r * D)];
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[d] += p * vj[d];
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const float inv = 1.0f / w.l[size_t(r)];
    float* o = a.out + ((t0 + r / group) * a.Hq + kh * group + r % group) * D;
    const float* acc = &w.acc[size_t(r * D)];
#pragma omp simd
    for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
  }
}


}  // namespace

void attention(ThreadPool* pool, const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq,
               int Hkv, int D, float scale, float* out) {
  if (cpu::cpu_features().has_avx2_set() && cpu::avx2::tiled_attention_supports(D)) {
    const int64_t qb = cpu::avx2::prefill_query_tokens(Hq / Hkv);
    const int64_t n_qb = (T + qb - 1) / qb, n_items = int64_t(Hkv) * n_qb;
    const cpu::avx2::PrefillAttention args{q, k, v, T, n_kv, Hq, Hkv, D, scale, out};
    auto work = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t t0 = (i % n_qb) * qb;
        cpu::avx2::prefill_attention_block(args, int(i / n_qb), t0, std::min(qb, T - t0));
      }
    };
    if (pool) pool->parallel_for(n_items, 1, work);
    else work(0, n_items);
    return;
  }
  const int64_t n_tb = (T + kQueryBlock - 1) / kQueryBlock, items = int64_t(Hkv) * n_tb;
  const AttentionArgs args{q, k, v, T, n_kv, Hq, Hkv, D, scale, out};
  auto work = [&](int64_t b, int64_t e) {
    thread_local AttentionScratch scratch;  // grows once per thread
    for (int64_t i = b; i < e; ++i) attention_block(args, i, scratch);
  };
  if (pool) pool->parallel_for(items, 1, work);
  else work(0, items);
}

// Keys per flash-decoding split: long enough that a split's merge is cheap next to its reads,
// short enough that a few hundred keys already give both threads work (the AVX2 kernel's items
// cover every KV head, so splits are its only parallelism).
constexpr int64_t kKeysPerSplit = 256;

namespace {

// One work item of the portable attention_paged (a query token, KV head and key split), for
// CPUs without AVX2 or head sizes attention_avx2 does not take.
struct PagedArgs {
  const float* q;
  const PagedKv* kv;
  int64_t T, n_kv;
  int Hq, Hkv, D;
  float scale;
  int group;
  int64_t P, pages_per_split, splits, part;
  float* partial;
};

struct PagedScratch {
  std::vector<float> kbuf, vbuf, s;
};

void paged_item(const PagedArgs& a, int64_t it, PagedScratch& w) {
  const PagedKv& kv = *a.kv;
  const int group = a.group, D = a.D, Hq = a.Hq, Hkv = a.Hkv;
  const int64_t P = a.P, splits = a.splits, pages_per_split = a.pages_per_split, part = a.part, T = a.T,
                n_kv = a.n_kv;
  const float scale = a.scale;
  const float* const q = a.q;
  float* const partial = a.partial;
  std::vector<float>&kbuf = w.kbuf, &vbuf = w.vbuf, &s = w.s;
  const size_t elt = kv.bf16 ? 2 : 4;
  const int64_t sp = it % splits, t = it / splits / Hkv;
  const int kh = int(it / splits % Hkv);
  const int64_t n = n_kv - T + t + 1;  // keys 0..n-1
  const int64_t k_begin = sp * pages_per_split * P, k_end = std::min(n, (sp + 1) * pages_per_split * P);
  float* res = partial + it * part;
  for (int g = 0; g < group; ++g) {
    float* acc = res + g * (D + 2);
    std::fill(acc, acc + D, 0.0f);
    acc[D] = -INFINITY, acc[D + 1] = 0.0f;  // m, l
  }
  const float* qg = q + (t * Hq + int64_t(kh) * group) * D;
  for (int64_t p0 = k_begin; p0 < k_end; p0 += P) {
    const int64_t cnt = std::min(P, k_end - p0);
    const uint8_t* kp = kv.k_pages[p0 / P];
    const uint8_t* vp = kv.v_pages[p0 / P];
    auto row = [&](const uint8_t* page, int64_t j, float* buf) -> const float* {
      const uint8_t* src = page + size_t(j * kv.row + int64_t(kh) * D) * elt;
      if (!kv.bf16) return reinterpret_cast<const float*>(src);
      to_f32(Dtype::bf16, src, buf, D);
      return buf;
    };
    for (int64_t j = 0; j < cnt; ++j) {
      const float* kj = row(kp, j, kbuf.data());
      for (int g = 0; g < group; ++g) {
        s[size_t(g * P + j)] = dot(qg + g * D, kj, D) * scale;
      }
    }
    for (int g = 0; g < group; ++g) {
      float* acc = res + g * (D + 2);
      float* sg = &s[size_t(g * P)];
      float bm = -INFINITY;
      for (int64_t j = 0; j < cnt; ++j) bm = std::max(bm, sg[j]);
      if (bm > acc[D]) {
        const float c = std::exp(acc[D] - bm);  // 0 on the first block
        acc[D + 1] *= c;
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[d] *= c;
        acc[D] = bm;
      }
      for (int64_t j = 0; j < cnt; ++j) acc[D + 1] += (sg[j] = std::exp(sg[j] - acc[D]));
    }
    for (int64_t j = 0; j < cnt; ++j) {
      const float* vj = row(vp, j, vbuf.data());
      for (int g = 0; g < group; ++g) {
        const float pj = s[size_t(g * P + j)];
        float* acc = res + g * (D + 2);
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[d] += pj * vj[d];
      }
    }
  }
}

void paged_items(const PagedArgs& a, int64_t b, int64_t e, PagedScratch& w) {
  w.kbuf.resize(size_t(a.D)), w.vbuf.resize(size_t(a.D)), w.s.resize(size_t(a.group * a.P));
  for (int64_t i = b; i < e; ++i) paged_item(a, i, w);
}

}  // namespace

// Per query row and head: keys in blocks of one page; the running max m, sum l and output acc
// are rescaled once per block when the block raises the max (flash-decoding's online softmax).
void attention_paged(ThreadPool* pool, const float* q, const PagedKv& kv, int64_t T, int64_t n_kv, int Hq, int Hkv,
                     int D, float scale, float* out) {
  // An item is one (query token, KV head, key split) — on AVX2 with D % 16 == 0 one (query
  // token, key split) over every KV head, so each page is read as one contiguous block: the
  // `group` query heads of a KV head share every K/V row read (GQA: reading it per query head
  // would stream the cache group×).
  // Decode has only Hkv (token, KV head) pairs, too few to occupy the threads over a long
  // context, so keys are also split page-aligned across items (flash-decoding) and the splits'
  // partial softmax states (m, l, acc) are merged afterwards.
  // The splits depend on the context length alone, never on the threads or the batch: a
  // sequence's attention (and so its logits) is bitwise the same alone, batched, with or
  // without a pool.
  const int group = Hq / Hkv;
  const int64_t P = kv.page_tokens;
  const int64_t pages = (n_kv + P - 1) / P;
  const int64_t pages_per_split = std::max<int64_t>(1, kKeysPerSplit / P);
  const int64_t splits = (pages + pages_per_split - 1) / pages_per_split;
  const int64_t part = int64_t(group) * (D + 2);  // per item: group × (acc[D], m, l)
  thread_local std::vector<float> partial_buf;  // the calling thread's; grows once
  partial_buf.resize(size_t(T * Hkv * splits * part));
  float* const partial = partial_buf.data();  // by pointer: workers would see their own thread_local
  const PagedArgs args{q, &kv, T, n_kv, Hq, Hkv, D, scale, group, P, pages_per_split, splits, part, partial};
  const bool tiled = cpu::cpu_features().has_avx2_set() && cpu::avx2::tiled_attention_supports(D);
  auto work = [&](int64_t b, int64_t e) {
    if (tiled) {  // items (token, split), every KV head: partial keeps paged_item's layout
      for (int64_t it = b; it < e; ++it) {
        const int64_t sp = it % splits, t = it / splits;
        const int64_t n = n_kv - T + t + 1;  // keys 0..n-1
        const int64_t k_begin = sp * pages_per_split * P, k_end = std::min(n, (sp + 1) * pages_per_split * P);
        cpu::avx2::paged_attention_split(q + t * Hq * D, kv, Hkv, group, D, scale, k_begin, k_end,
                                         partial + (t * Hkv * splits + sp) * part, splits * part);
      }
      return;
    }
    thread_local PagedScratch scratch;  // grows once per thread
    paged_items(args, b, e, scratch);
  };
  const int64_t items = tiled ? T * splits : T * Hkv * splits;
  if (pool) pool->parallel_for(items, 1, work);
  else work(0, items);
  // Merge the splits of each (token, query head): rescale each to the largest max, sum, divide.
  for (int64_t t = 0; t < T; ++t)
    for (int kh = 0; kh < Hkv; ++kh)
      for (int g = 0; g < group; ++g) {
        const float* first = partial + (t * Hkv + kh) * splits * part + g * (D + 2);
        float m = -INFINITY;
        for (int64_t sp = 0; sp < splits; ++sp) m = std::max(m, first[sp * part + D]);
        float* o = out + (t * Hq + int64_t(kh) * group + g) * D;
        std::fill(o, o + D, 0.0f);
        float l = 0.0f;
        for (int64_t sp = 0; sp < splits; ++sp) {
          const float* r = first + sp * part;
          if (r[D + 1] == 0.0f) continue;  // a split past this token's last key
          const float c = std::exp(r[D] - m);
          l += c * r[D + 1];
          for (int d = 0; d < D; ++d) o[d] += c * r[d];
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < D; ++d) o[d] *= inv;
      }
}

}  // namespace kiln::engine::ops
