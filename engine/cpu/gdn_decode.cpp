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

// conv1d_silu for one token over channels [c0, c0 + n): window = stored K−1 inputs then x.
// Also fetches `pf` (advanced by two cache lines per channel, up to pf_end) towards L2: the
// item's first recurrent state, which the delta rule would otherwise wait on memory for.
void conv_channels(const GdnDecodeArgs& a, int64_t C, int64_t c0, int64_t n, float* window, float* out,
                   const char*& pf, const char* pf_end) {
  const int K = a.K;
  for (int64_t ch = c0; ch < c0 + n; ++ch) {
    if (pf < pf_end) {
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + 64, _MM_HINT_T1);
      pf += 128;
    }
    for (int s = 0; s < K - 1; ++s) {
      const size_t i = size_t(s * C + ch);
      window[s] = a.conv_bf16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(a.conv_state)[i])
                              : reinterpret_cast<const float*>(a.conv_state)[i];
    }
    window[K - 1] = a.qkv[ch];
    const float* wc = a.conv_w + ch * K;
    float acc = 0;
    for (int s = 0; s < K; ++s) acc += wc[s] * window[s];
    out[ch - c0] = acc;
    for (int s = 0; s < K - 1; ++s) {  // shift: the oldest input leaves, x enters
      const size_t i = size_t(s * C + ch);
      if (a.conv_bf16) reinterpret_cast<uint16_t*>(a.conv_state)[i] = f32_to_bf16(window[s + 1]);
      else reinterpret_cast<float*>(a.conv_state)[i] = window[s + 1];
    }
  }
  silu_inplace(out, n);  // as conv1d_silu applies it
}

}  // namespace

void gated_delta_net_decode(ThreadPool* pool, const GdnDecodeArgs& a) {
  const int r = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  const int64_t key_dim = int64_t(a.Hk) * dk, C = 2 * key_dim + int64_t(a.Hv) * dv;
  auto item = [&](int64_t m0, int64_t m1) {
    thread_local std::vector<float> buf;  // per thread: q[dk] k[dk] v[r·dv] beta[r] g[r] window[K]
    buf.resize(size_t(2 * dk + r * dv + 2 * r + a.K));
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
