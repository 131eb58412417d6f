// Qwen3.5/3.6 forward pass (model-spec §3). Layer i: x += Mixer(RMSNorm_in(x));
// x += FFN(RMSNorm_post(x)); Mixer = gated attention (full) or Gated DeltaNet (linear).
// All activations and states in f32; weights as stored (bf16/f16/f32) through ops::matmul.
#include "engine/models/qwen35.h"

#include <cmath>
#include <vector>

#include "engine/ops.h"

namespace kiln::engine {

using Buf = std::vector<float>;

void Qwen35Model::init_state(SequenceState& st) const {
  st.gdn.assign(size_t(c_.n_linear_layers()), {});
  for (auto& s : st.gdn) {
    s.conv.assign(size_t(c_.linear_conv_kernel_dim - 1) * size_t(c_.conv_dim()) * cache_dtype_size(st.dtype), 0);
    s.recurrent.assign(size_t(c_.linear_num_value_heads) * c_.linear_key_head_dim * c_.linear_value_head_dim, 0.f);
  }
}

void Qwen35Model::forward(const int32_t* tokens, int64_t T, SequenceState& st, bool all_logits,
                          float* logits) const {
  const int64_t H = c_.hidden_size;
  Buf x(static_cast<size_t>(T * H)), a(size_t(T * H)), out(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) to_f32(w_.embed_tokens.dtype, w_.embed_tokens.row_ptr(tokens[t]), &x[size_t(t * H)], H);
  int full = 0, linear = 0;
  for (const LayerWeights& L : w_.layers) {
    ops::rms_norm(x.data(), T, H, L.input_layernorm.data(), true, c_.rms_norm_eps, a.data());
    if (L.type == LayerType::full_attention) attention_block(L.attn, full++, a.data(), T, st, out.data());
    else delta_net_block(L.gdn, a.data(), T, st.gdn[size_t(linear++)], st.dtype, out.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += out[i];
    ops::rms_norm(x.data(), T, H, L.post_attention_layernorm.data(), true, c_.rms_norm_eps, a.data());
    if (c_.is_moe) moe_block(L.moe, a.data(), T, out.data());
    else mlp_block(L.mlp, a.data(), T, out.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += out[i];
  }
  st.n_past += T;
  const int64_t rows = all_logits ? T : 1;
  const float* h = all_logits ? x.data() : x.data() + (T - 1) * H;
  ops::rms_norm(h, rows, H, w_.norm.data(), true, c_.rms_norm_eps, a.data());
  ops::matmul(pool_, a.data(), rows, w_.lm_head, logits);
}

// Gated full attention (§3.5): q_proj rows are per head [q(D) | gate(D)].
void Qwen35Model::attention_block(const AttentionWeights& w, int slot, const float* a, int64_t T, SequenceState& st,
                                  float* out) const {
  const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, D = c_.head_dim;
  const int64_t kv_dim = c_.kv_dim(), n_kv = st.n_past + T;
  Buf qg(static_cast<size_t>(T * Hq * 2 * D)), q(size_t(T * Hq * D)), gate(size_t(T * Hq * D)), k(size_t(T * kv_dim)),
      v(size_t(T * kv_dim));
  ops::matmul(pool_, a, T, w.q_proj, qg.data());
  ops::matmul(pool_, a, T, w.k_proj, k.data());
  ops::matmul(pool_, a, T, w.v_proj, v.data());
  for (int64_t th = 0; th < T * Hq; ++th) {
    std::copy_n(&qg[size_t(th * 2 * D)], D, &q[size_t(th * D)]);
    std::copy_n(&qg[size_t(th * 2 * D + D)], D, &gate[size_t(th * D)]);
  }
  ops::rms_norm(q.data(), T * Hq, D, w.q_norm.data(), true, c_.rms_norm_eps, q.data());
  ops::rms_norm(k.data(), T * Hkv, D, w.k_norm.data(), true, c_.rms_norm_eps, k.data());
  ops::rope_neox(q.data(), T, Hq, D, c_.rotary_dim, st.n_past, c_.rope_theta);
  ops::rope_neox(k.data(), T, Hkv, D, c_.rotary_dim, st.n_past, c_.rope_theta);
  for (int64_t t = 0; t < T; ++t) st.kv->write(slot, st.n_past + t, &k[size_t(t * kv_dim)], &v[size_t(t * kv_dim)]);
  Buf K(static_cast<size_t>(n_kv * kv_dim)), V(size_t(n_kv * kv_dim)), o(size_t(T * Hq * D));
  st.kv->gather(slot, n_kv, K.data(), V.data());  // read back: prefill and decode see the same cache
  ops::attention(pool_, q.data(), K.data(), V.data(), T, n_kv, Hq, Hkv, D, 1.0f / std::sqrt(float(D)), o.data());
  for (size_t i = 0; i < o.size(); ++i) o[i] *= ops::sigmoid(gate[i]);
  ops::matmul(pool_, o.data(), T, w.o_proj, out);
}

// Gated DeltaNet (§3.6): conv + SiLU, L2 norm, gated delta rule, gated RMSNorm, out_proj.
void Qwen35Model::delta_net_block(const DeltaNetWeights& w, const float* a, int64_t T, DeltaNetState& s,
                                  CacheDtype dtype, float* out) const {
  const int Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim, K = c_.linear_conv_kernel_dim;
  const int64_t C = c_.conv_dim(), key_dim = c_.key_dim(), value_dim = c_.value_dim();
  Buf c(static_cast<size_t>(T * C)), ch(size_t(T * C)), z(size_t(T * value_dim)), b(size_t(T * Hv)), alpha(size_t(T * Hv));
  ops::matmul(pool_, a, T, w.in_proj_qkv, c.data());
  ops::matmul(pool_, a, T, w.in_proj_z, z.data());
  ops::matmul(pool_, a, T, w.in_proj_b, b.data());
  ops::matmul(pool_, a, T, w.in_proj_a, alpha.data());
  Buf conv_state(static_cast<size_t>((K - 1) * C));
  s.load_conv(dtype, conv_state.data());
  ops::conv1d_silu(c.data(), T, C, K, w.conv1d.data(), conv_state.data(), ch.data());
  s.store_conv(dtype, conv_state.data());
  for (int64_t t = 0; t < T; ++t) {  // q and k heads, each L2-normalised; q also scaled by 1/√dk
    ops::l2_norm(&ch[size_t(t * C)], Hk, dk, 1e-6, 1.0f / std::sqrt(float(dk)));
    ops::l2_norm(&ch[size_t(t * C + key_dim)], Hk, dk, 1e-6, 1.0f);
  }
  Buf beta(static_cast<size_t>(T * Hv)), g(size_t(T * Hv));
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < Hv; ++j) {
      const size_t i = size_t(t * Hv + j);
      const float u = alpha[i] + w.dt_bias[size_t(j)];
      const float softplus = u > 20.0f ? u : std::log1p(std::exp(u));
      beta[i] = ops::sigmoid(b[i]);
      g[i] = -std::exp(w.A_log[size_t(j)]) * softplus;  // ≤ 0: decay γ = e^g ≤ 1
    }
  Buf o(static_cast<size_t>(T * value_dim));
  ops::DeltaRuleArgs args{T, Hk, Hv, dk, dv, &ch[0], &ch[size_t(key_dim)], &ch[size_t(2 * key_dim)], C, C, C,
                          beta.data(), g.data(), s.recurrent.data(), o.data()};
  if (T == 1) ops::gated_delta_rule_recurrent(pool_, args);
  else ops::gated_delta_rule_chunked(pool_, args);
  ops::rms_norm_gated(o.data(), z.data(), T * Hv, dv, w.norm.data(), c_.rms_norm_eps, o.data());
  ops::matmul(pool_, o.data(), T, w.out_proj, out);
}

// SwiGLU MLP (§3.7): down(silu(gate·a) ⊙ up·a).
void Qwen35Model::mlp_block(const MlpWeights& w, const float* a, int64_t T, float* out) const {
  const int64_t I = w.gate_proj.rows;
  Buf g(static_cast<size_t>(T * I)), u(size_t(T * I));
  ops::matmul(pool_, a, T, w.gate_proj, g.data());
  ops::matmul(pool_, a, T, w.up_proj, u.data());
  ops::silu_mul(g.data(), I, u.data(), I, T, I, g.data());
  ops::matmul(pool_, g.data(), T, w.down_proj, out);
}

// MoE (§3.8): softmax router, top-k renormalised, SwiGLU experts run on the tokens routed to
// them (gathered, so each expert is one matrix product), plus the σ-gated shared expert.
void Qwen35Model::moe_block(const MoeWeights& w, const float* a, int64_t T, float* out) const {
  const int64_t H = c_.hidden_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  Buf router(static_cast<size_t>(T * E)), weights(size_t(T * k));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  ops::matmul(pool_, a, T, w.router, router.data());
  ops::moe_route(router.data(), T, E, k, ids.data(), weights.data());
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));  // expert → (token, weight)
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) routed[size_t(ids[size_t(t * k + i)])].push_back({t, weights[size_t(t * k + i)]});
  std::fill(out, out + T * H, 0.0f);
  Buf xa, ya;
  for (int e = 0; e < E; ++e) {
    const auto& list = routed[size_t(e)];
    if (list.empty()) continue;
    const int64_t n = int64_t(list.size());
    xa.resize(size_t(n * H));
    ya.resize(size_t(n * H));
    for (int64_t r = 0; r < n; ++r) std::copy_n(a + list[size_t(r)].first * H, H, &xa[size_t(r * H)]);
    mlp_block(w.experts[size_t(e)], xa.data(), n, ya.data());
    for (int64_t r = 0; r < n; ++r) {
      float* o = out + list[size_t(r)].first * H;
      const float wt = list[size_t(r)].second;
      for (int64_t i = 0; i < H; ++i) o[i] += wt * ya[size_t(r * H + i)];
    }
  }
  if (!w.has_shared_expert) return;
  Buf s(static_cast<size_t>(T * H)), sg(static_cast<size_t>(T));
  mlp_block(w.shared_expert, a, T, s.data());
  ops::matmul(pool_, a, T, w.shared_expert_gate, sg.data());
  for (int64_t t = 0; t < T; ++t) {
    const float gt = ops::sigmoid(sg[size_t(t)]);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += gt * s[size_t(t * H + i)];
  }
}

}  // namespace kiln::engine
