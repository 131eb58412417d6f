// Fast paths for matmul and attention: multithreaded over output rows / heads, weights read once
// per call (each 4-row tile of W is widened to f32 once and reused for all T tokens, so T > 1 is a
// matrix-matrix product). Twins: matmul_ref, attention_ref in ops_ref.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

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

}  // namespace

void matmul(ThreadPool* pool, const float* x, int64_t T, const Matrix& w, float* y) {
  const int64_t N = w.rows, K = w.cols;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  auto work = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> buf;
    if (w.dtype != Dtype::f32) buf.resize(size_t(kTileRows * K));
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
  // Grain: enough rows that a chunk is worth a hand-off (~64K multiply-adds).
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, K * T * kTileRows));
  if (pool) pool->parallel_for(tiles, grain, work);
  else work(0, tiles);
}

void attention(ThreadPool* pool, const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq,
               int Hkv, int D, float scale, float* out) {
  const int group = Hq / Hkv;
  auto work = [&](int64_t b, int64_t e) {
    std::vector<float> p(static_cast<size_t>(n_kv));
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / Hq;
      const int h = int(th % Hq), kh = h / group;
      const int64_t last = n_kv - T + t;
      const float* qh = q + th * D;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        p[size_t(j)] = dot(qh, k + (j * Hkv + kh) * D, D) * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      float* o = out + th * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float pj = p[size_t(j)] / sum;
        const float* vj = v + (j * Hkv + kh) * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) o[d] += pj * vj[d];
      }
    }
  };
  if (pool) pool->parallel_for(T * Hq, 1, work);
  else work(0, T * Hq);
}

}  // namespace kiln::engine::ops
