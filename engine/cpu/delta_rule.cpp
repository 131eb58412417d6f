// Chunked gated delta rule (model-spec §3.6, chunk C = 64), the prefill path. Per value head and
// chunk of n ≤ C rows, with Γ = cumsum(g) inside the chunk and S₀ the incoming state:
//   A_ij = β_i (k_i·k_j) e^{Γ_i−Γ_j} (j < i);  (I+A) U = β⊙V;  (I+A) W = β⊙e^Γ⊙K   (forward subst.)
//   V' = U − W S₀;  O_i = e^{Γ_i} q_i S₀ + Σ_{j≤i} (q_i·k_j) e^{Γ_i−Γ_j} V'_j
//   S  = e^{Γ_n} S₀ + Σ_j e^{Γ_n−Γ_j} k_j ⊗ V'_j
// Γ is non-increasing (g ≤ 0), so every exponent of a difference is ≤ 0: nothing overflows. A last
// chunk shorter than C is the same as zero padding. Twin: gated_delta_rule_recurrent.
//
// The chunk-internal math runs in double: solving (I+A) by forward substitution amplifies
// rounding when keys are correlated, and in f32 that alone moved the logits of small-head test
// models by ~3e-5 against the recurrent form. The three products with the state (W S₀, Q S₀,
// Kᵀ V': 3 of the 4.4 M multiply-adds of a 64-token chunk at dk = dv = 128) are plain sums of
// well-scaled terms and run in float on the stored f32 state, at twice the double rate; the
// state is rounded to f32 once per chunk (the recurrent form rounds it after every token).
#include <algorithm>
#include <cmath>
#include <vector>

#include <immintrin.h>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/denormals.h"
#include "engine/cpu/gemm_small.h"
#include "engine/ops.h"

namespace kiln::engine::ops {

// As matrix operations (cpu::gemm_f64/gemm_f32, AVX2 when present): per chunk, the Gram matrices
// KKᵀ and QKᵀ, the inverse of the unit lower-triangular (I+A) (n³/6 flops, n ≤ 64), U and W as
// products with it, V' = U − W S₀, O = diag(e^Γ) Q S₀ + (QK ⊙ decay) V', S = e^{Γ_n} S₀ + (f ⊙ K)ᵀ V'.
void gated_delta_rule_chunked(ThreadPool* pool, const DeltaRuleArgs& a) {
  using Acc = double;
  const int r = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  constexpr int C = kDeltaRuleChunk;
  auto head = [&](int64_t j0, int64_t j1) {
    // Per-thread scratch, grown once (~0.8 MB at dk = dv = 128): allocating and zeroing it per
    // call cost a memset and, past malloc's mmap threshold, page faults every layer. Every
    // element read below is written first in the same chunk.
    thread_local std::vector<Acc> G, Kc, Qc, Kt, Vc, KK, QK, Tinv, U, W, Vp, O;
    thread_local std::vector<float> Wf, Qf, Ktf, Vpf, Of;
    const cpu::FlushDenormalsScope flush_denormals;
    for (auto [v, size] : {std::pair{&G, size_t(C)}, {&Kc, size_t(C) * dk}, {&Qc, size_t(C) * dk},
                           {&Kt, size_t(dk) * C}, {&Vc, size_t(C) * dv}, {&KK, size_t(C) * C}, {&QK, size_t(C) * C},
                           {&Tinv, size_t(C) * C}, {&U, size_t(C) * dv}, {&W, size_t(C) * dk}, {&Vp, size_t(C) * dv},
                           {&O, size_t(C) * dv}})
      if (v->size() < size) v->resize(size);
    for (auto [v, size] : {std::pair{&Wf, size_t(C) * dk}, {&Qf, size_t(C) * dk}, {&Ktf, size_t(dk) * C},
                           {&Vpf, size_t(C) * dv}, {&Of, size_t(C) * dv}})
      if (v->size() < size) v->resize(size);
    for (int64_t j = j0; j < j1; ++j) {
      float* S = a.state + j * dk * dv;  // [dk][dv], updated in place chunk by chunk
      const int64_t m = j / r;
      for (int64_t c0 = 0; c0 < a.T; c0 += C) {
        const int n = int(std::min<int64_t>(C, a.T - c0));
        Acc acc = 0;
        for (int i = 0; i < n; ++i) {
          G[size_t(i)] = (acc += a.g[(c0 + i) * a.Hv + j]);
          const float* qi = a.q + (c0 + i) * a.q_stride + m * dk;
          const float* ki = a.k + (c0 + i) * a.k_stride + m * dk;
          const float* vi = a.v + (c0 + i) * a.v_stride + j * dv;
          for (int d = 0; d < dk; ++d) {
            Qc[size_t(i * dk + d)] = qi[d];
            Kc[size_t(i * dk + d)] = ki[d];
            Kt[size_t(d * n + i)] = ki[d];
          }
          for (int e = 0; e < dv; ++e) Vc[size_t(i * dv + e)] = vi[e];
        }
        auto beta = [&](int i) { return Acc(a.beta[(c0 + i) * a.Hv + j]); };
        // Only the lower triangles are used: entries above the diagonal are not computed.
        cpu::gemm_f64(n, n, dk, 1.0, Kc.data(), dk, Kt.data(), n, 0.0, KK.data(), n, cpu::Triangle::lower_c);
        cpu::gemm_f64(n, n, dk, 1.0, Qc.data(), dk, Kt.data(), n, 0.0, QK.data(), n, cpu::Triangle::lower_c);
        // A_il = β_i (k_i·k_l) e^{Γ_i−Γ_l} (l < i), kept in KK; QK masked to l ≤ i and decayed.
        for (int i = 0; i < n; ++i)
          for (int l = 0; l < n; ++l) {
            const Acc decay = l <= i ? std::exp(G[size_t(i)] - G[size_t(l)]) : 0.0;
            KK[size_t(i * n + l)] = l < i ? beta(i) * KK[size_t(i * n + l)] * decay : 0.0;
            QK[size_t(i * n + l)] = l <= i ? QK[size_t(i * n + l)] * decay : 0.0;
          }
        // Tinv = (I + A)⁻¹, unit lower triangular: row i from the rows above it.
        for (int i = 0; i < n; ++i) {
          Acc* t = &Tinv[size_t(i * n)];
          std::fill(t, t + n, 0.0);
          t[i] = 1.0;
          for (int l = 0; l < i; ++l) {
            const Acc al = KK[size_t(i * n + l)];
            if (al == 0.0) continue;
            const Acc* tl = &Tinv[size_t(l * n)];
            for (int c = 0; c <= l; ++c) t[c] -= al * tl[c];
          }
        }
        // U = Tinv (β ⊙ V),  W = Tinv (β e^Γ ⊙ K): scale rows in place, then multiply.
        for (int i = 0; i < n; ++i) {
          const Acc b = beta(i), bg = b * std::exp(G[size_t(i)]);
          for (int e = 0; e < dv; ++e) Vc[size_t(i * dv + e)] *= b;
          for (int d = 0; d < dk; ++d) Kc[size_t(i * dk + d)] *= bg;
        }
        cpu::gemm_f64(n, dv, n, 1.0, Tinv.data(), n, Vc.data(), dv, 0.0, U.data(), dv, cpu::Triangle::lower_a);
        cpu::gemm_f64(n, dk, n, 1.0, Tinv.data(), n, Kc.data(), dk, 0.0, W.data(), dk, cpu::Triangle::lower_a);
        // V' = U − W S₀ (float; V' is rounded to float once, and both uses below read that value)
        for (size_t i = 0; i < size_t(n) * dk; ++i) Wf[i] = float(W[i]);
        for (size_t i = 0; i < size_t(n) * dv; ++i) Vpf[i] = float(U[i]);
        cpu::gemm_f32(n, dv, dk, -1.0f, Wf.data(), dk, S, dv, 1.0f, Vpf.data(), dv);
        for (size_t i = 0; i < size_t(n) * dv; ++i) Vp[i] = Vpf[i];
        // O = diag(e^Γ) Q S₀ (float) + QK V' (double)
        for (int i = 0; i < n; ++i) {
          const Acc eg = std::exp(G[size_t(i)]);
          for (int d = 0; d < dk; ++d) Qf[size_t(i * dk + d)] = float(Qc[size_t(i * dk + d)] * eg);
        }
        cpu::gemm_f32(n, dv, dk, 1.0f, Qf.data(), dk, S, dv, 0.0f, Of.data(), dv);
        for (size_t i = 0; i < size_t(n) * dv; ++i) O[i] = Of[i];
        cpu::gemm_f64(n, dv, n, 1.0, QK.data(), n, Vp.data(), dv, 1.0, O.data(), dv, cpu::Triangle::lower_a);
        for (int i = 0; i < n; ++i) {
          float* out = a.out + ((c0 + i) * a.Hv + j) * dv;
          for (int e = 0; e < dv; ++e) out[e] = float(O[size_t(i * dv + e)]);
        }
        // S = e^{Γ_n} S₀ + (f ⊙ K)ᵀ V',  f_l = e^{Γ_n−Γ_l} (float, in place)
        const Acc gn = G[size_t(n - 1)];
        for (int l = 0; l < n; ++l) {
          const Acc f = std::exp(gn - G[size_t(l)]);
          for (int d = 0; d < dk; ++d) Ktf[size_t(d * n + l)] = float(Kt[size_t(d * n + l)] * f);
        }
        cpu::gemm_f32(dk, dv, n, 1.0f, Ktf.data(), n, Vpf.data(), dv, float(std::exp(gn)), S, dv);
      }
    }
  };
  if (pool) pool->parallel_for(a.Hv, 1, head);
  else head(0, a.Hv);
}

}  // namespace kiln::engine::ops

// ---- Decode: the recurrent form with AVX2 ------------------------------------------------------
// Same math and precision as gated_delta_rule_recurrent (double sums, f32 state between tokens),
// in 4-wide double vectors: per head, one pass over S for e = v − γSᵀk, one for the update and
// o = Sᵀq. A decode step reads and writes every sequence's whole state (Hv·dk·dv f32 per layer),
// so this pass is memory-bound; the scalar twin spent most of its time converting one element
// at a time.
namespace kiln::engine::ops {
namespace {

__attribute__((target("avx2,fma"))) void decode_head_avx2(const float* q, const float* k, const float* v,
                                                           double beta, double gamma, float* S, int dk, int dv,
                                                           float* out, double* e, double* o, const float* next) {
  const int dv4 = dv & ~3;
  // next: the state the caller reads after this one (or nullptr). The second pass below works on
  // S from cache and leaves the memory bus idle; fetching next's rows meanwhile lets the next
  // head's first pass read from L2 instead of waiting on memory (~30% of a decode head).
  const size_t row_bytes = size_t(dv) * sizeof(float);
  for (int b = 0; b < dv; ++b) e[b] = v[b], o[b] = 0.0;
  for (int i = 0; i < dk; ++i) {  // e = v − γ Sᵀk
    const float* Si = S + size_t(i) * dv;
    const double kg = gamma * k[i];
    const __m256d kg4 = _mm256_set1_pd(kg);
    int b = 0;
    for (; b < dv4; b += 4)
      _mm256_storeu_pd(e + b, _mm256_fnmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(Si + b)), kg4, _mm256_loadu_pd(e + b)));
    for (; b < dv; ++b) e[b] -= double(Si[b]) * kg;
  }
  const __m256d g4 = _mm256_set1_pd(gamma);
  for (int i = 0; i < dk; ++i) {  // S ← γS + k ⊗ βe;  o = Sᵀq after the update
    float* Si = S + size_t(i) * dv;
    const double kb = double(k[i]) * beta, qi = q[i];
    const __m256d kb4 = _mm256_set1_pd(kb), q4 = _mm256_set1_pd(qi);
    if (next) {
      const char* nr = reinterpret_cast<const char*>(next + size_t(i) * dv);
      for (size_t off = 0; off < row_bytes; off += 64) _mm_prefetch(nr + off, _MM_HINT_T1);
    }
    int b = 0;
    for (; b < dv4; b += 4) {
      const __m256d s =
          _mm256_fmadd_pd(kb4, _mm256_loadu_pd(e + b), _mm256_mul_pd(g4, _mm256_cvtps_pd(_mm_loadu_ps(Si + b))));
      _mm_storeu_ps(Si + b, _mm256_cvtpd_ps(s));
      _mm256_storeu_pd(o + b, _mm256_fmadd_pd(s, q4, _mm256_loadu_pd(o + b)));
    }
    for (; b < dv; ++b) {
      const double s = gamma * Si[b] + kb * e[b];
      Si[b] = float(s);
      o[b] += s * qi;
    }
  }
  for (int b = 0; b < dv; ++b) out[b] = float(o[b]);
}

}  // namespace

void gated_delta_rule_decode(ThreadPool* pool, const DeltaRuleArgs& a) {
  if (!cpu::cpu_features().has_avx2_set()) return gated_delta_rule_recurrent(pool, a);
  const int r = a.Hv / a.Hk;
  auto head = [&](int64_t j0, int64_t j1) {
    thread_local std::vector<double> e, o;
    e.resize(size_t(a.dv)), o.resize(size_t(a.dv));
    const cpu::FlushDenormalsScope flush_denormals;  // as in the chunked form
    for (int64_t j = j0; j < j1; ++j) {
      float* S = a.state + j * a.dk * a.dv;
      const int64_t m = j / r;
      for (int64_t t = 0; t < a.T; ++t) {
        const float* next = t + 1 < a.T ? nullptr : j + 1 < j1 ? S + a.dk * a.dv : nullptr;
        decode_head_avx2(a.q + t * a.q_stride + m * a.dk, a.k + t * a.k_stride + m * a.dk,
                         a.v + t * a.v_stride + j * a.dv, a.beta[t * a.Hv + j], std::exp(double(a.g[t * a.Hv + j])),
                         S, a.dk, a.dv, a.out + (t * a.Hv + j) * a.dv, e.data(), o.data(), next);
      }
    }
  };
  if (pool) pool->parallel_for(a.Hv, 1, head);
  else head(0, a.Hv);
}

}  // namespace kiln::engine::ops
