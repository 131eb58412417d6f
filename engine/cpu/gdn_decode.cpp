// The fused Gated DeltaNet decode step (ops.h: gated_delta_net_decode). Work item = one key head
// m and its r = Hv/Hk value heads: the channels it convolves (q_m, k_m, v_j for its j), its
// state slices and output rows are its own, so items never share a written element. Built only
// from the unfused ops' per-element arithmetic (ops_ref.cpp's conv1d_silu and l2_norm formulas,
// gated_delta_rule_decode, rms_norm_gated on one row), so the fused and unfused paths agree bit
// for bit — prefill (unfused, chunked) and decode keep seeing the same conv window and state.
#include <cmath>
#include <vector>

#include <xmmintrin.h>

#include "engine/ops.h"

namespace kiln::engine::ops {
namespace {

// conv1d_silu for one token over channels [c0, c0 + n): window = stored K−1 inputs then x. Tap
// by tap over runs of channels, as conv1d_silu does (acc = 0, then acc += tap_s·window_s for
// s = 0..K−1), so the compiler vectorises it and every sum is the same. Also fetches `pf`
// (two cache lines per channel, up to pf_end) towards L2, a run at a time: the item's first
// recurrent state, which the delta rule would otherwise wait on memory for.
constexpr int64_t kConvRun = 16;

void conv_channels(const GdnDecodeArgs& a, int64_t C, int64_t c0, int64_t n, float* window, float* out,
                   const char*& pf, const char* pf_end) {
  const int K = a.K;
  for (int64_t r0 = 0; r0 < n; r0 += kConvRun) {
    const int64_t m = n - r0 < kConvRun ? n - r0 : kConvRun, ch0 = c0 + r0;
    for (int64_t i = 0; i < m && pf < pf_end; ++i, pf += 128) {
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + 64, _MM_HINT_T1);
    }
    // window[s][i]: input s (oldest first) of channel ch0 + i; the last is x.
    for (int s = 0; s < K - 1; ++s) {
      float* w = window + s * kConvRun;
      const size_t at = size_t(s * C + ch0);
      if (a.conv_bf16) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(a.conv_state) + at;
        for (int64_t i = 0; i < m; ++i) w[i] = bf16_to_f32(h[i]);
      } else {
        const float* f = reinterpret_cast<const float*>(a.conv_state) + at;
        for (int64_t i = 0; i < m; ++i) w[i] = f[i];
      }
    }
    float* o = out + r0;
    for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
    for (int s = 0; s < K; ++s) {
      const float* row = s < K - 1 ? window + s * kConvRun : a.qkv + ch0;
      const float* tap = a.conv_taps + s * C + ch0;
      for (int64_t i = 0; i < m; ++i) o[i] += tap[i] * row[i];
    }
    for (int s = 0; s < K - 1; ++s) {  // shift: the oldest input leaves, x enters
      const float* src = s + 1 < K - 1 ? window + (s + 1) * kConvRun : a.qkv + ch0;
      const size_t at = size_t(s * C + ch0);
      if (a.conv_bf16) {
        uint16_t* h = reinterpret_cast<uint16_t*>(a.conv_state) + at;
        for (int64_t i = 0; i < m; ++i) h[i] = f32_to_bf16(src[i]);
      } else {
        float* f = reinterpret_cast<float*>(a.conv_state) + at;
        for (int64_t i = 0; i < m; ++i) f[i] = src[i];
      }
    }
  }
  silu_inplace(out, n);  // as conv1d_silu applies it
}

}  // namespace

void gated_delta_net_decode(ThreadPool* pool, const GdnDecodeArgs& a) {
  const int r = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  const int64_t key_dim = int64_t(a.Hk) * dk, C = 2 * key_dim + int64_t(a.Hv) * dv;
  auto item = [&](int64_t m0, int64_t m1) {
    thread_local std::vector<float> buf;  // per thread: q[dk] k[dk] v[r·dv] beta[r] g[r] window[K−1][run]
    buf.resize(size_t(2 * dk + r * dv + 2 * r + (a.K - 1) * kConvRun));
    float *q = buf.data(), *k = q + dk, *v = k + dk, *beta = v + r * dv, *g = beta + r, *window = g + r;
    for (int64_t m = m0; m < m1; ++m) {
      float* const S = a.state + m * r * int64_t(dk) * dv;
      const char* pf = reinterpret_cast<const char*>(S);
      const char* const pf_end = pf + size_t(dk) * dv * sizeof(float);
      conv_channels(a, C, m * dk, dk, window, q, pf, pf_end);
      conv_channels(a, C, key_dim + m * dk, dk, window, k, pf, pf_end);
      conv_channels(a, C, 2 * key_dim + m * r * dv, int64_t(r) * dv, window, v, pf, pf_end);
      l2_norm(q, 1, dk, 1e-6, 1.0f / std::sqrt(float(dk)));
      l2_norm(k, 1, dk, 1e-6, 1.0f);
      for (int i = 0; i < r; ++i) {
        const int64_t j = m * r + i;
        const GdnGates gates = gdn_gates(a.a[j], a.b[j], a.A_log[j], a.dt_bias[j]);
        beta[i] = gates.beta, g[i] = gates.g;
      }
      float* out = a.out + m * r * dv;
      const DeltaRuleArgs d{1,    1,    r,    dk,   dv,   q,   k, v, dk, dk, int64_t(r) * dv, beta, g,
                            S, out};
      gated_delta_rule_decode(nullptr, d);
      rms_norm_gated(out, a.z + m * r * dv, r, dv, a.norm_w, a.eps, out);
    }
  };
  if (pool) pool->parallel_for(a.Hk, 1, item);
  else item(0, a.Hk);
}

}  // namespace kiln::engine::ops
