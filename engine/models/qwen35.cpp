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
  const ops::MatmulJob qkv[] = {{&w.q_proj, a, T, qg.data()}, {&w.k_proj, a, T, k.data()}, {&w.v_proj, a, T, v.data()}};
  ops::matmul_group(pool_, qkv, 3);
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
  const ops::MatmulJob in[] = {{&w.in_proj_qkv, a, T, c.data()},
                               {&w.in_proj_z, a, T, z.data()},
                               {&w.in_proj_b, a, T, b.data()},
                               {&w.in_proj_a, a, T, alpha.data()}};
  ops::matmul_group(pool_, in, 4);
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
  const ops::MatmulJob gate_up[] = {{&w.gate_proj, a, T, g.data()}, {&w.up_proj, a, T, u.data()}};
  ops::matmul_group(pool_, gate_up, 2);
  ops::silu_mul(g.data(), I, u.data(), I, T, I, g.data());
  ops::matmul(pool_, g.data(), T, w.down_proj, out);
}

// MoE (§3.8): softmax router, top-k renormalised, SwiGLU experts run on the tokens routed to
// them (gathered, so each expert is one matrix product; unselected experts are never read), plus
// the σ-gated shared expert. All gate/up products (routed, shared, shared gate) form one parallel
// section and all down products a second: a decode step's experts are too small for a fork/join
// each. Scratch is per thread and only grows, so decode allocates nothing here.
void Qwen35Model::moe_block(const MoeWeights& w, const float* a, int64_t T, float* out) const {
  const int64_t H = c_.hidden_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  thread_local Buf router, weights, xa, gu, ya, s, sgu, sg;
  thread_local std::vector<int32_t> ids, count, start, fill;
  thread_local std::vector<ops::MatmulJob> jobs;
  router.resize(size_t(T * E));
  weights.resize(size_t(T * k));
  ids.resize(size_t(T * k));
  ops::matmul(pool_, a, T, w.router, router.data());
  ops::moe_route(router.data(), T, E, k, ids.data(), weights.data());
  // Counting sort of (token, slot) by expert: rows of expert e are [start[e], start[e]+count[e]).
  count.assign(size_t(E), 0);
  for (int64_t i = 0; i < T * k; ++i) ++count[size_t(ids[size_t(i)])];
  start.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) start[size_t(e) + 1] = start[size_t(e)] + count[size_t(e)];
  fill.assign(start.begin(), start.end() - 1);
  std::vector<int32_t>& slot_of_row = count;  // reuse: row → (token·k + slot)
  slot_of_row.assign(size_t(T * k), 0);
  for (int64_t i = 0; i < T * k; ++i) slot_of_row[size_t(fill[size_t(ids[size_t(i)])]++)] = int32_t(i);
  const int64_t I = c_.moe_intermediate_size, R = T * k;
  xa.resize(size_t(R * H));
  gu.resize(size_t(R * 2 * I));
  ya.resize(size_t(R * H));
  for (int64_t r = 0; r < R; ++r) std::copy_n(a + (slot_of_row[size_t(r)] / k) * H, H, &xa[size_t(r * H)]);
  const bool shared = w.has_shared_expert;
  const int64_t SI = shared ? w.shared_expert.gate_proj.rows : 0;
  if (shared) {
    sgu.resize(size_t(T * 2 * SI));
    s.resize(size_t(T * H));
    sg.resize(size_t(T));
  }
  // Gate and up: outputs side by side per expert, [n_e][I] gate then [n_e][I] up.
  jobs.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t n = start[size_t(e) + 1] - start[size_t(e)];
    if (n == 0) continue;
    const float* x = &xa[size_t(start[size_t(e)] * H)];
    float* g = &gu[size_t(start[size_t(e)] * 2 * I)];
    jobs.push_back({&w.experts[size_t(e)].gate_proj, x, n, g});
    jobs.push_back({&w.experts[size_t(e)].up_proj, x, n, g + n * I});
  }
  if (shared) {
    jobs.push_back({&w.shared_expert.gate_proj, a, T, sgu.data()});
    jobs.push_back({&w.shared_expert.up_proj, a, T, sgu.data() + T * SI});
    jobs.push_back({&w.shared_expert_gate, a, T, sg.data()});
  }
  ops::matmul_group(pool_, jobs.data(), int(jobs.size()));
  jobs.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t n = start[size_t(e) + 1] - start[size_t(e)];
    if (n == 0) continue;
    float* g = &gu[size_t(start[size_t(e)] * 2 * I)];
    ops::silu_mul(g, I, g + n * I, I, n, I, g);
    jobs.push_back({&w.experts[size_t(e)].down_proj, g, n, &ya[size_t(start[size_t(e)] * H)]});
  }
  if (shared) {
    ops::silu_mul(sgu.data(), SI, sgu.data() + T * SI, SI, T, SI, sgu.data());
    jobs.push_back({&w.shared_expert.down_proj, sgu.data(), T, s.data()});
  }
  ops::matmul_group(pool_, jobs.data(), int(jobs.size()));
  // Combine in (token, slot) order so the sum's rounding does not depend on the routing layout.
  std::fill(out, out + T * H, 0.0f);
  fill.assign(size_t(T * k), 0);
  for (int64_t r = 0; r < R; ++r) fill[size_t(slot_of_row[size_t(r)])] = int32_t(r);
  for (int64_t i = 0; i < T * k; ++i) {
    float* o = out + (i / k) * H;
    const float wt = weights[size_t(i)];
    const float* y = &ya[size_t(fill[size_t(i)] * H)];
    for (int64_t h = 0; h < H; ++h) o[h] += wt * y[h];
  }
  if (!shared) return;
  for (int64_t t = 0; t < T; ++t) {
    const float gt = ops::sigmoid(sg[size_t(t)]);
    for (int64_t h = 0; h < H; ++h) out[t * H + h] += gt * s[size_t(t * H + h)];
  }
}

}  // namespace kiln::engine
