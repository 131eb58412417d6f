// Fast paths for matmul and attention: multithreaded over output rows / heads, weights read once
// per call. bf16/q8/q4 weights run the SIMD kernels of engine/cpu/matmul.h (tiled over tokens
// for T > 1); f32/f16 tiles of W are (widened to f32 once and) reused for all T tokens.
// Twins: matmul_ref, attention_ref in ops_ref.cpp.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/ops.h"

namespace kiln::engine::ops {
namespace {

constexpr int64_t kTileRows = 4;

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
  const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows;
  auto work = [&](int64_t b, int64_t e) {
    fn(wm, in, y, w.rows, b * kTileRows, std::min(w.rows, e * kTileRows));
  };
  // Grain: enough rows that a chunk is worth a hand-off (~64K multiply-adds).
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, w.cols * T * kTileRows));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

void matmul_group(ThreadPool* pool, const MatmulJob* jobs, int n_jobs) {
  const cpu::KernelTable& kt = cpu::kernels_best();
  // Per calling thread, reused: one activation buffer per job, prefix sums of row tiles.
  // (The workers must see the caller's instances: named through references, never directly.)
  thread_local std::vector<cpu::ActQ16Buffer> acts_tls;
  thread_local std::vector<cpu::MatmulInput> inputs_tls;
  thread_local std::vector<int64_t> first_tile_tls;
  std::vector<cpu::ActQ16Buffer>& acts = acts_tls;
  std::vector<cpu::MatmulInput>& inputs = inputs_tls;
  std::vector<int64_t>& first_tile = first_tile_tls;
  if (int(acts.size()) < n_jobs) acts.resize(size_t(n_jobs));
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
    inputs[size_t(i)] = cpu::prepare_input(kt, *kernel_format(j.w->dtype), j.x, j.T, j.w->cols, acts[size_t(i)]);
    first_tile[size_t(i) + 1] = first_tile[size_t(i)] + (j.w->rows + kTileRows - 1) / kTileRows;
    macs += j.w->rows * j.w->cols * j.T;
  }
  const int64_t tiles = first_tile[size_t(n_jobs)];
  if (tiles == 0) return;
  auto work = [&](int64_t b, int64_t e) {
    // Jobs are contiguous in tile space; walk from the one holding tile b.
    int i = int(std::upper_bound(first_tile.begin(), first_tile.end(), b) - first_tile.begin()) - 1;
    for (int64_t t = b; t < e; ++i) {
      const int64_t job_end = std::min(e, first_tile[size_t(i) + 1]);
      if (job_end <= t) continue;
      const MatmulJob& j = jobs[i];
      const cpu::WeightFormat f = *kernel_format(j.w->dtype);
      const cpu::WeightMatrix wm{f, j.w->rows, j.w->cols, static_cast<const uint8_t*>(j.w->data)};
      const int64_t r0 = (t - first_tile[size_t(i)]) * kTileRows;
      const int64_t r1 = std::min(j.w->rows, (job_end - first_tile[size_t(i)]) * kTileRows);
      kt.matmul[int(f)](wm, inputs[size_t(i)], j.y, j.w->rows, r0, r1);
      t = job_end;
    }
  };
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, macs / tiles));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

namespace {

struct AttentionArgs {
  const float *q, *k, *v;
  int64_t T, n_kv;
  int Hq, Hkv, D;
  float scale;
  float* out;
};

// Items [b, e) of (query row, head): scores, softmax, weighted values. Inlined into a baseline
// and an AVX2+FMA copy (8-wide simd reductions, fused multiply-adds), chosen once by CPUID:
// prefill attention is T·n_kv·D multiply-adds per head, the largest compute of a long chunk.
__attribute__((always_inline)) inline void attention_items(const AttentionArgs& a, int64_t b, int64_t e, float* p) {
  const int group = a.Hq / a.Hkv, D = a.D;
  for (int64_t th = b; th < e; ++th) {
    const int64_t t = th / a.Hq;
    const int h = int(th % a.Hq), kh = h / group;
    const int64_t last = a.n_kv - a.T + t;
    const float* qh = a.q + th * D;
    float mx = -INFINITY;
    for (int64_t j = 0; j <= last; ++j) {
      const float* kj = a.k + (j * a.Hkv + kh) * D;
      float sdot = 0;
#pragma omp simd reduction(+ : sdot)
      for (int d = 0; d < D; ++d) sdot += qh[d] * kj[d];
      p[size_t(j)] = sdot * a.scale;
      mx = std::max(mx, p[size_t(j)]);
    }
    float sum = 0;
    for (int64_t j = 0; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
    float* o = a.out + th * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j <= last; ++j) {
      const float pj = p[size_t(j)] / sum;
      const float* vj = a.v + (j * a.Hkv + kh) * D;
#pragma omp simd
      for (int d = 0; d < D; ++d) o[d] += pj * vj[d];
    }
  }
}

void attention_items_base(const AttentionArgs& a, int64_t b, int64_t e, float* p) { attention_items(a, b, e, p); }
__attribute__((target("avx2,fma"))) void attention_items_avx2(const AttentionArgs& a, int64_t b, int64_t e, float* p) {
  attention_items(a, b, e, p);
}

}  // namespace

void attention(ThreadPool* pool, const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq,
               int Hkv, int D, float scale, float* out) {
  const AttentionArgs args{q, k, v, T, n_kv, Hq, Hkv, D, scale, out};
  static const auto items = cpu::cpu_features().has_avx2_set() ? attention_items_avx2 : attention_items_base;
  auto work = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> p;
    p.resize(static_cast<size_t>(n_kv));
    items(args, b, e, p.data());
  };
  if (pool) pool->parallel_for(T * Hq, 1, work);
  else work(0, T * Hq);
}

// Per query row and head: keys in blocks of one page; the running max m, sum l and output acc
// are rescaled once per block when the block raises the max (flash-decoding's online softmax).
void attention_paged(ThreadPool* pool, const float* q, const PagedKv& kv, int64_t T, int64_t n_kv, int Hq, int Hkv,
                     int D, float scale, float* out) {
  const int group = Hq / Hkv;
  const int64_t P = kv.page_tokens;
  auto work = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> kbuf, vbuf, s;
    kbuf.resize(size_t(P * D)), vbuf.resize(size_t(P * D)), s.resize(size_t(P));
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / Hq;
      const int h = int(th % Hq), kh = h / group;
      const int64_t n = n_kv - T + t + 1;  // keys 0..n-1
      const float* qh = q + th * D;
      float* o = out + th * D;
      std::fill(o, o + D, 0.0f);
      float m = -INFINITY, l = 0.0f;
      for (int64_t p0 = 0; p0 < n; p0 += P) {
        const int64_t cnt = std::min(P, n - p0);
        const uint8_t* kp = kv.k_pages[p0 / P];
        const uint8_t* vp = kv.v_pages[p0 / P];
        const size_t elt = kv.bf16 ? 2 : 4;
        auto rows = [&](const uint8_t* page, int64_t j, float* buf) -> const float* {
          const uint8_t* src = page + size_t(j * kv.row + int64_t(kh) * D) * elt;
          if (!kv.bf16) return reinterpret_cast<const float*>(src);
          to_f32(Dtype::bf16, src, buf, D);
          return buf;
        };
        float bm = -INFINITY;
        for (int64_t j = 0; j < cnt; ++j) {
          s[size_t(j)] = dot(qh, rows(kp, j, &kbuf[size_t(j * D)]), D) * scale;
          bm = std::max(bm, s[size_t(j)]);
        }
        if (bm > m) {
          const float c = std::exp(m - bm);  // 0 on the first block
          l *= c;
#pragma omp simd
          for (int d = 0; d < D; ++d) o[d] *= c;
          m = bm;
        }
        for (int64_t j = 0; j < cnt; ++j) {
          const float pj = std::exp(s[size_t(j)] - m);
          l += pj;
          const float* vj = rows(vp, j, &vbuf[size_t(j * D)]);
#pragma omp simd
          for (int d = 0; d < D; ++d) o[d] += pj * vj[d];
        }
      }
      const float inv = 1.0f / l;
      for (int d = 0; d < D; ++d) o[d] *= inv;
    }
  };
  if (pool) pool->parallel_for(T * Hq, 1, work);
  else work(0, T * Hq);
}

}  // namespace kiln::engine::ops
