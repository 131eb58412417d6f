// Chunked gated delta rule (model-spec §3.6, chunk C = 64), the prefill path. Per value head and
// chunk of n ≤ C rows, with Γ = cumsum(g) inside the chunk and S₀ the incoming state:
//   A_ij = β_i (k_i·k_j) e^{Γ_i−Γ_j} (j < i);  (I+A) U = β⊙V;  (I+A) W = β⊙e^Γ⊙K   (forward subst.)
//   V' = U − W S₀;  O_i = e^{Γ_i} q_i S₀ + Σ_{j≤i} (q_i·k_j) e^{Γ_i−Γ_j} V'_j
//   S  = e^{Γ_n} S₀ + Σ_j e^{Γ_n−Γ_j} k_j ⊗ V'_j
// Γ is non-increasing (g ≤ 0), so every exponent of a difference is ≤ 0: nothing overflows. A last
// chunk shorter than C is the same as zero padding. Twin: gated_delta_rule_recurrent.
//
// The chunk math runs in double (inputs, outputs and the stored state stay f32): solving (I+A) by
// forward substitution amplifies rounding when keys are correlated, and in f32 that alone moved
// the logits of small-head test models by ~3e-5 against the recurrent form. The cost is small next
// to the projections; a SIMD f32 version with compensated sums is a job for the speed work.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops.h"

namespace kiln::engine::ops {

void gated_delta_rule_chunked(ThreadPool* pool, const DeltaRuleArgs& a) {
  using Acc = double;
  const int r = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  constexpr int C = kDeltaRuleChunk;
  auto head = [&](int64_t j0, int64_t j1) {
    std::vector<Acc> G(C), A(C * C), QK(C * C), U(static_cast<size_t>(C) * dv), W(static_cast<size_t>(C) * dk),
        Vp(static_cast<size_t>(C) * dv), S(static_cast<size_t>(dk) * dv), S0(static_cast<size_t>(dk) * dv),
        o(static_cast<size_t>(dv));
    for (int64_t j = j0; j < j1; ++j) {
      float* state = a.state + j * dk * dv;
      std::copy(state, state + dk * dv, S.begin());
      const int64_t m = j / r;
      for (int64_t c0 = 0; c0 < a.T; c0 += C) {
        const int n = int(std::min<int64_t>(C, a.T - c0));
        auto qrow = [&](int i) { return a.q + (c0 + i) * a.q_stride + m * dk; };
        auto krow = [&](int i) { return a.k + (c0 + i) * a.k_stride + m * dk; };
        auto vrow = [&](int i) { return a.v + (c0 + i) * a.v_stride + j * dv; };
        auto beta = [&](int i) { return Acc(a.beta[(c0 + i) * a.Hv + j]); };
        Acc acc = 0;
        for (int i = 0; i < n; ++i) G[size_t(i)] = (acc += a.g[(c0 + i) * a.Hv + j]);
        for (int i = 0; i < n; ++i)
          for (int l = 0; l <= i; ++l) {
            Acc kk = 0, qk = 0;
            const float *ki = krow(i), *kl = krow(l), *qi = qrow(i);
            for (int d = 0; d < dk; ++d) kk += Acc(ki[d]) * kl[d], qk += Acc(qi[d]) * kl[d];
            const Acc decay = std::exp(G[size_t(i)] - G[size_t(l)]);
            A[size_t(i * C + l)] = beta(i) * kk * decay;
            QK[size_t(i * C + l)] = qk * decay;
          }
        // Forward substitution: row i of U and W needs rows < i.
        for (int i = 0; i < n; ++i) {
          Acc* u = &U[size_t(i) * dv];
          Acc* w = &W[size_t(i) * dk];
          const Acc b = beta(i), bg = b * std::exp(G[size_t(i)]);
          const float *vi = vrow(i), *ki = krow(i);
          for (int d = 0; d < dv; ++d) u[d] = b * vi[d];
          for (int d = 0; d < dk; ++d) w[d] = bg * ki[d];
          for (int l = 0; l < i; ++l) {
            const Acc al = A[size_t(i * C + l)];
            const Acc *ul = &U[size_t(l) * dv], *wl = &W[size_t(l) * dk];
            for (int d = 0; d < dv; ++d) u[d] -= al * ul[d];
            for (int d = 0; d < dk; ++d) w[d] -= al * wl[d];
          }
        }
        S0 = S;
        // V' = U − W S₀
        for (int i = 0; i < n; ++i) {
          Acc* vp = &Vp[size_t(i) * dv];
          std::copy(&U[size_t(i) * dv], &U[size_t(i) * dv] + dv, vp);
          const Acc* w = &W[size_t(i) * dk];
          for (int d = 0; d < dk; ++d) {
            const Acc wd = w[d];
            const Acc* s = &S0[size_t(d) * dv];
            for (int e = 0; e < dv; ++e) vp[e] -= wd * s[e];
          }
        }
        // O_i = e^{Γ_i} q_i S₀ + Σ_{l≤i} QK_il V'_l
        for (int i = 0; i < n; ++i) {
          std::fill(o.begin(), o.end(), 0.0);
          const float* qi = qrow(i);
          const Acc eg = std::exp(G[size_t(i)]);
          for (int d = 0; d < dk; ++d) {
            const Acc qd = qi[d] * eg;
            const Acc* s = &S0[size_t(d) * dv];
            for (int e = 0; e < dv; ++e) o[size_t(e)] += qd * s[e];
          }
          for (int l = 0; l <= i; ++l) {
            const Acc c = QK[size_t(i * C + l)];
            const Acc* vp = &Vp[size_t(l) * dv];
            for (int e = 0; e < dv; ++e) o[size_t(e)] += c * vp[e];
          }
          float* out = a.out + ((c0 + i) * a.Hv + j) * dv;
          for (int e = 0; e < dv; ++e) out[e] = float(o[size_t(e)]);
        }
        // S = e^{Γ_n} S₀ + Σ_l e^{Γ_n−Γ_l} k_l ⊗ V'_l
        const Acc gn = G[size_t(n - 1)], egn = std::exp(gn);
        for (size_t i = 0; i < S.size(); ++i) S[i] = egn * S0[i];
        for (int l = 0; l < n; ++l) {
          const Acc f = std::exp(gn - G[size_t(l)]);
          const float* kl = krow(l);
          const Acc* vp = &Vp[size_t(l) * dv];
          for (int d = 0; d < dk; ++d) {
            const Acc kd = kl[d] * f;
            Acc* s = &S[size_t(d) * dv];
            for (int e = 0; e < dv; ++e) s[e] += kd * vp[e];
          }
        }
      }
      for (size_t i = 0; i < S.size(); ++i) state[i] = float(S[i]);
    }
  };
  if (pool) pool->parallel_for(a.Hv, 1, head);
  else head(0, a.Hv);
}

}  // namespace kiln::engine::ops
