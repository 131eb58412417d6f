// Plain scalar implementations: the `_ref` twins, and the ops whose plain form is already the
// one the model uses (norms, RoPE, conv, routing). Obviously correct first; never optimised.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/ops.h"

namespace kiln::engine::ops {

void matmul_ref(const float* x, int64_t T, const Matrix& w, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t n = 0; n < w.rows; ++n) {
    to_f32(w.dtype, w.row_ptr(n), row.data(), w.cols);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += double(x[t * w.cols + k]) * row[size_t(k)];
      y[t * w.rows + n] = float(s);
    }
  }
}

void rms_norm(const float* x, int64_t rows, int64_t n, const float* w, bool zero_centred, double eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * (zero_centred ? 1.0f + w[i] : w[i]);
  }
}

void rms_norm_gated(const float* x, const float* z, int64_t rows, int64_t n, const float* w, double eps, float* y) {
  thread_local std::vector<float> gate;  // silu(z) of one row; grown once
  gate.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
    std::copy(z + r * n, z + (r + 1) * n, gate.begin());
    silu_inplace(gate.data(), n);  // the shared SiLU (ops_fast.cpp: vector e^x)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = xr[i] * inv * w[i] * gate[size_t(i)];
  }
}

void l2_norm(float* x, int64_t rows, int64_t n, double eps, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float f = float(1.0 / std::sqrt(ss + eps)) * scale;
    for (int64_t i = 0; i < n; ++i) xr[i] *= f;
  }
}

void rope_neox(float* x, int64_t T, int n_heads, int head_dim, int rot_dim, int64_t pos0, double theta) {
  const int half = rot_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    const double p = double(pos0 + t);
    for (int j = 0; j < half; ++j) {
      const double angle = p * std::pow(theta, -2.0 * j / rot_dim);  // angles in f64: exact at long range
      c[size_t(j)] = float(std::cos(angle));
      s[size_t(j)] = float(std::sin(angle));
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * c[size_t(j)] - b * s[size_t(j)];
        v[j + half] = b * c[size_t(j)] + a * s[size_t(j)];
      }
    }
  }
}

void attention_ref(const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq, int Hkv, int D,
                   float scale, float* out) {
  const int group = Hq / Hkv;
  std::vector<double> p(static_cast<size_t>(n_kv));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t last = n_kv - T + t;  // causal: keys 0..last
    for (int h = 0; h < Hq; ++h) {
      const float* qh = q + (t * Hq + h) * D;
      const int kh = h / group;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += double(qh[d]) * k[(j * Hkv + kh) * D + d];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      float* o = out + (t * Hq + h) * D;
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= last; ++j) acc += p[size_t(j)] * v[(j * Hkv + kh) * D + d];
        o[d] = float(acc / sum);
      }
    }
  }
}

void conv1d_silu(const float* x, int64_t T, int64_t C, int K, const float* w, float* state, float* out) {
  // Window row i (0 ≤ i < K−1+T): the stored history for i < K−1, else input step i−(K−1).
  // Computed a step at a time over all channels, so every row is read in order (one channel
  // at a time strode through a prompt chunk C floats per step); each output is the same sum in
  // the same order: acc = 0, then acc += w[ch][s]·window[t+s][ch] for s = 0..K−1.
  auto window = [&](int64_t i) { return i < K - 1 ? state + i * C : x + (i - (K - 1)) * C; };
  thread_local std::vector<float> taps;  // w transposed to [K][C]; grown once
  taps.resize(static_cast<size_t>(K * C));
  for (int64_t ch = 0; ch < C; ++ch)
    for (int s = 0; s < K; ++s) taps[size_t(s * C + ch)] = w[ch * K + s];
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * C;
    for (int64_t ch = 0; ch < C; ++ch) o[ch] = 0.0f;
    for (int s = 0; s < K; ++s) {
      const float* row = window(t + s);
      const float* tap = &taps[size_t(s * C)];
      for (int64_t ch = 0; ch < C; ++ch) o[ch] += tap[ch] * row[ch];
    }
    silu_inplace(o, C);  // shared with the fused decode step (ops_fast.cpp: vector e^x)
  }
  // New history: window rows T..T+K−2. Row s takes row T+s ≥ s, which (when it is itself
  // history) has not been overwritten yet.
  for (int s = 0; s < K - 1; ++s) {
    const float* src = window(T + s);
    if (src != state + s * C) std::copy(src, src + C, state + s * C);
  }
}

void gated_delta_rule_recurrent(ThreadPool* pool, const DeltaRuleArgs& a) {
  // The state is stored f32 between tokens (model-spec §9.1); within a step the sums run in double.
  const int r = a.Hv / a.Hk;
  auto head = [&](int64_t j0, int64_t j1) {
    std::vector<double> e(static_cast<size_t>(a.dv)), o(static_cast<size_t>(a.dv));
    for (int64_t j = j0; j < j1; ++j) {
      float* S = a.state + j * a.dk * a.dv;
      const int64_t m = j / r;
      for (int64_t t = 0; t < a.T; ++t) {
        const float* q = a.q + t * a.q_stride + m * a.dk;
        const float* k = a.k + t * a.k_stride + m * a.dk;
        const float* v = a.v + t * a.v_stride + j * a.dv;
        const double beta = a.beta[t * a.Hv + j], gamma = std::exp(double(a.g[t * a.Hv + j]));
        for (int b = 0; b < a.dv; ++b) e[size_t(b)] = v[b];
        for (int i = 0; i < a.dk; ++i)
          for (int b = 0; b < a.dv; ++b) e[size_t(b)] -= gamma * S[i * a.dv + b] * k[i];  // e = v − (γS)ᵀk
        std::fill(o.begin(), o.end(), 0.0);
        for (int i = 0; i < a.dk; ++i)
          for (int b = 0; b < a.dv; ++b) {
            const double s = gamma * S[i * a.dv + b] + k[i] * beta * e[size_t(b)];  // S ← γS + k ⊗ βe
            S[i * a.dv + b] = float(s);
            o[size_t(b)] += s * q[i];  // o = Sᵀq, after the update
          }
        float* out = a.out + (t * a.Hv + j) * a.dv;
        for (int b = 0; b < a.dv; ++b) out[b] = float(o[size_t(b)]);
      }
    }
  };
  if (pool) pool->parallel_for(a.Hv, 1, head);
  else head(0, a.Hv);
}

void moe_route(const float* logits, int64_t T, int E, int k, int32_t* ids, float* weights) {
  thread_local std::vector<float> p;
  thread_local std::vector<int32_t> order;
  p.resize(static_cast<size_t>(E)), order.resize(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    const float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) p[size_t(e)] = float(p[size_t(e)] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return p[size_t(x)] > p[size_t(y)] || (p[size_t(x)] == p[size_t(y)] && x < y);
    });
    double top = 0;
    for (int i = 0; i < k; ++i) top += p[size_t(order[size_t(i)])];
    for (int i = 0; i < k; ++i) {
      ids[t * k + i] = order[size_t(i)];
      weights[t * k + i] = float(p[size_t(order[size_t(i)])] / top);
    }
  }
}

}  // namespace kiln::engine::ops
