// The op vocabulary of the Qwen3.5/3.6 hybrids. Ops know nothing about models or sessions.
//
// Dimension names used below: T = tokens in the step, H = hidden size, N/K = output/input features
// of a matrix, Hq/Hkv = attention query/KV heads of size D, Hk/Hv = GDN key/value heads of size
// dk/dv, C = conv channels, E = experts. Activations are row-major f32 [T][...].
//
// Every op has a plain scalar `_ref` twin (engine/cpu/ops_ref.cpp: obviously correct, never
// optimised) and the fast path the model calls (engine/cpu/ops_fast.cpp, delta_rule.cpp). tests/engine/ops_test.cpp
// compares each pair. Ops with a ThreadPool* may use it (nullptr = single thread).
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/cpu/thread_pool.h"
#include "engine/weights/safetensors.h"

namespace kiln::engine {

// A read-only [rows][cols] matrix in a checkpoint dtype, usually a view into the mmap.
struct Matrix {
  const void* data = nullptr;
  Dtype dtype = Dtype::f32;
  int64_t rows = 0, cols = 0;
  const uint8_t* row_ptr(int64_t r) const {
    return static_cast<const uint8_t*>(data) + size_t(r) * dtype_row_bytes(dtype, cols);
  }
  Matrix row_slice(int64_t first, int64_t n) const { return Matrix{row_ptr(first), dtype, n, cols}; }
};

namespace ops {

// y[T][N] = x[T][K] · Wᵀ, W = [N][K] (HF Linear). Accumulates in f32.
void matmul(ThreadPool* pool, const float* x, int64_t T, const Matrix& w, float* y);
void matmul_ref(const float* x, int64_t T, const Matrix& w, float* y);

// Several independent products y_i[T_i][N_i] = x_i · W_iᵀ in one parallel section: a decode
// step's expert FFNs (or q/k/v) are each too small to be worth a fork/join of their own.
// Same results as calling matmul on each job.
struct MatmulJob {
  const Matrix* w = nullptr;
  const float* x = nullptr;
  int64_t T = 0;
  float* y = nullptr;
};
void matmul_group(ThreadPool* pool, const MatmulJob* jobs, int n_jobs);

// SwiGLU products h = silu(x·Gᵀ) ⊙ (x·Uᵀ) for several (gate, up) pairs in one parallel section:
// each work item computes the same rows of a pair's gate and up products and applies silu_mul to
// them, so no serial pass over the intermediate activations follows the section (a decode
// step's routed and shared experts). G and U are [I][K]; g, u, h are [T][I] (h may alias g).
// Same results as matmul_group of the gate and up products followed by silu_mul. A job without
// `up` is a plain product g = x·Gᵀ sharing the section (a decode step's router next to the
// shared expert); its u and h are unused.
struct SwigluJob {
  const Matrix* gate = nullptr;
  const Matrix* up = nullptr;   // nullptr: plain product into g
  const float* x = nullptr;
  int64_t T = 0;
  float* g = nullptr;
  float* u = nullptr;
  float* h = nullptr;
};
void matmul_swiglu_group(ThreadPool* pool, const SwigluJob* jobs, int n_jobs);

// RMSNorm over rows of n: y = x / sqrt(mean(x²)+eps) · (1+w) if zero_centred, else · w.
// y may alias x.
void rms_norm(const float* x, int64_t rows, int64_t n, const float* w, bool zero_centred, double eps, float* y);

// Gated RMSNorm of the GDN output, per row of n: y = x/sqrt(mean(x²)+eps) · w · silu(z).
void rms_norm_gated(const float* x, const float* z, int64_t rows, int64_t n, const float* w, double eps, float* y);

// L2 norm per row of n: x / sqrt(Σx² + eps) · scale, in place.
void l2_norm(float* x, int64_t rows, int64_t n, double eps, float scale);

// Partial NeoX RoPE in place on x[T][n_heads][head_dim]: the first rot_dim dims of each head,
// pairing j with j+rot_dim/2, at position pos0 + t; θ_j = theta^(−2j/rot_dim).
void rope_neox(float* x, int64_t T, int n_heads, int head_dim, int rot_dim, int64_t pos0, double theta);

// Causal GQA attention. q[T][Hq][D]; k, v [n_kv][Hkv][D] hold every position 0..n_kv−1, and query
// t is at position n_kv − T + t (it sees keys 0..that). out[T][Hq][D]. Softmax in f32.
void attention(ThreadPool* pool, const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq,
               int Hkv, int D, float scale, float* out);
void attention_ref(const float* q, const float* k, const float* v, int64_t T, int64_t n_kv, int Hq, int Hkv, int D,
                   float scale, float* out);

// The same attention reading K/V straight from a paged cache (no gather into contiguous buffers):
// position p is row p % page_tokens of page p / page_tokens; rows of `row` = Hkv·D elements in f32
// or bf16. Online softmax per page-sized block of keys (no score matrix over all positions).
struct PagedKv {
  const uint8_t* const* k_pages = nullptr;  // per page: this layer's K rows [page_tokens][row]
  const uint8_t* const* v_pages = nullptr;  // per page: this layer's V rows
  int64_t page_tokens = 0;
  int64_t row = 0;
  bool bf16 = false;
};
void attention_paged(ThreadPool* pool, const float* q, const PagedKv& kv, int64_t T, int64_t n_kv, int Hq, int Hkv,
                     int D, float scale, float* out);

// Depthwise causal conv1d + SiLU over C channels with kernel K (w[C][K], w[.][K−1] multiplies
// the newest token). state[K−1][C] holds the previous K−1 pre-conv inputs (oldest first) and is
// updated to the last K−1 inputs. x, out [T][C].
void conv1d_silu(const float* x, int64_t T, int64_t C, int K, const float* w, float* state, float* out);

// Gated delta rule (model-spec §3.6). Per value head j (key head j / (Hv/Hk)), state S[j] is
// [dk][dv] f32. q, k [T][Hk][dk] (row strides q_stride/k_stride floats), already L2-normalised
// (q also scaled by 1/√dk); v [T][Hv][dv] (row stride v_stride); beta, g [T][Hv]; out [T][Hv][dv].
struct DeltaRuleArgs {
  int64_t T = 0;
  int Hk = 0, Hv = 0, dk = 0, dv = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* beta = nullptr;
  const float* g = nullptr;
  float* state = nullptr;
  float* out = nullptr;
};
// Recurrent form, token by token: the reference, and the decode path (T = 1).
void gated_delta_rule_recurrent(ThreadPool* pool, const DeltaRuleArgs& a);
// The recurrent form on AVX2 (same double sums; falls back to the twin without AVX2): decode.
void gated_delta_rule_decode(ThreadPool* pool, const DeltaRuleArgs& a);
// Chunked form (chunk 64, WY representation), the prefill path for T > 1.
void gated_delta_rule_chunked(ThreadPool* pool, const DeltaRuleArgs& a);
constexpr int kDeltaRuleChunk = 64;

// One Gated DeltaNet decode step (T = 1) of one sequence, everything between the in-projections
// and out_proj in one parallel section split by key head (a decode token otherwise spends more
// time in these small serial ops than the second thread can make up): for key head m, conv1d +
// SiLU of its q, k and value-head channels (conv window updated), L2 norms (q scaled 1/√dk),
// β = σ(b), g = −e^{A_log}·softplus(a + dt_bias), the recurrent delta rule
// (gated_delta_rule_decode) and the gated RMSNorm of each value head's output. Each element is
// computed as conv1d_silu, l2_norm, gated_delta_rule_decode and rms_norm_gated compute it, so
// results equal the unfused sequence of those ops bit for bit, with or without a pool.
struct GdnDecodeArgs {
  int Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;  // K: conv kernel
  const float* qkv = nullptr;   // [2·Hk·dk + Hv·dv] in_proj_qkv output (pre-conv)
  const float* z = nullptr;     // [Hv·dv] in_proj_z output
  const float* b = nullptr;     // [Hv] in_proj_b output
  const float* a = nullptr;     // [Hv] in_proj_a output
  const float* conv_taps = nullptr;  // [K][C]: conv1d_silu's w, transposed
  uint8_t* conv_state = nullptr;  // [K−1][C], f32 or bf16 (conv_bf16)
  bool conv_bf16 = false;
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm_w = nullptr;   // [dv]
  double eps = 1e-6;
  float* state = nullptr;  // [Hv][dk][dv]
  float* out = nullptr;    // [Hv·dv] gated-normed output (out_proj's input)
};
void gated_delta_net_decode(ThreadPool* pool, const GdnDecodeArgs& a);

// MoE router per token: softmax over E logits (f32), top-k by probability, renormalised.
// ids[T][k], weights[T][k].
void moe_route(const float* logits, int64_t T, int E, int k, int32_t* ids, float* weights);

// y[i] = silu(gate[i]) · up[i], rows of n; gate row stride g_stride, up row stride u_stride.
void silu_mul(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, int64_t rows, int64_t n,
              float* y);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
// x[i] = silu(x[i]) for n values in place; eight lanes at a time with a vector e^x on AVX2, and
// every element computed alike wherever it sits in x (conv1d_silu and the fused GDN decode step
// both use it, so prefill and decode see the same bits).
void silu_inplace(float* x, int64_t n);

// A Gated DeltaNet head's gates for one token (model-spec §3.6) from its projections a and b:
// beta = σ(b), decay g = −e^{A_log}·softplus(a + dt_bias) ≤ 0. One definition for prefill and
// the fused decode step, so both see the same bits.
struct GdnGates {
  float beta, g;
};
inline GdnGates gdn_gates(float a, float b, float A_log, float dt_bias) {
  const float u = a + dt_bias;
  const float softplus = u > 20.0f ? u : std::log1p(std::exp(u));
  return {sigmoid(b), -std::exp(A_log) * softplus};
}

}  // namespace ops
}  // namespace kiln::engine
