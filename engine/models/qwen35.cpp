// Qwen3.5/3.6 forward pass (model-spec §3) over a batch of sequence steps. Layer i:
// x += Mixer(RMSNorm_in(x)); x += FFN(RMSNorm_post(x)); Mixer = gated attention (full) or Gated
// DeltaNet (linear). All activations and states in f32; weights as stored through ops::matmul.
// x holds the rows of every sequence back to back; Rows says where each sequence's rows start.
#include "engine/models/qwen35.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops.h"

namespace kiln::engine {

using Buf = std::vector<float>;

struct Qwen35Model::Rows {
  std::span<const SeqStep> seqs;
  std::vector<int64_t> row0;        // first row of sequence i; row0[n] = total rows
  // Indices of one-token sequences (spread over the pool) and of the others (each with the whole
  // pool: prompt chunks, and sequential steps, which run in the decode form too).
  std::vector<size_t> decode, multi;
  int64_t total() const { return row0.back(); }
};

namespace {

// Runs fn(i, pool) for every sequence index in `decode` and `multi`. Single-token sequences are
// spread over the pool, one per task (their kernels then run single-threaded); a sequence of
// several tokens, or a lone decode, gets the whole pool. Kernels split work by head or row only,
// so a sequence's result is the same either way.
template <class Fn>
void for_each_sequence(ThreadPool* pool, const std::vector<size_t>& decode, const std::vector<size_t>& multi, Fn&& fn) {
  if (decode.size() == 1 || !pool) {
    for (size_t i : decode) fn(i, pool);
  } else if (!decode.empty()) {
    pool->parallel_for(int64_t(decode.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t d = b; d < e; ++d) fn(decode[size_t(d)], nullptr);
    });
  }
  for (size_t i : multi) fn(i, pool);
}

// One recorded position's GDN inputs for one linear layer in GdnRollback::inputs, laid out
// [position][linear layer][qkv (conv_dim) | z (value_dim) | b (Hv) | a (Hv)]: the one place that
// knows the layout, for the step that writes it and the replay that reads it.
template <class F>  // float (writing) or const float (reading)
struct GdnRecord {
  F *qkv, *z, *b, *a;
};
template <class F>
GdnRecord<F> gdn_record(F* inputs, const ModelConfig& c, int64_t position, size_t n_linear, int linear) {
  F* rec = inputs + (size_t(position) * n_linear + size_t(linear)) * size_t(c.gdn_input_floats());
  F* z = rec + c.conv_dim();
  F* b = z + c.value_dim();
  return {rec, z, b, b + c.linear_num_value_heads};
}

}  // namespace

void Qwen35Model::init_state(SequenceState& st) const {
  st.gdn.assign(size_t(c_.n_linear_layers()), {});
  for (auto& s : st.gdn) {
    s.conv.assign(size_t(c_.linear_conv_kernel_dim - 1) * size_t(c_.conv_dim()) * cache_dtype_size(st.dtype), 0);
    s.recurrent.assign(size_t(c_.linear_num_value_heads) * c_.linear_key_head_dim * c_.linear_value_head_dim, 0.f);
  }
}

void Qwen35Model::forward(const int32_t* tokens, int64_t T, SequenceState& st, bool all_logits,
                          float* logits) const {
  const SeqStep step{tokens, T, &st, all_logits ? LogitRows::all : LogitRows::last, logits};
  forward_batch(std::span<const SeqStep>(&step, 1));
}

void Qwen35Model::forward_batch(std::span<const SeqStep> seqs, StepStats* stats) const {
  const int64_t H = c_.hidden_size, V = c_.vocab_size;
  thread_local Rows rows;  // the scheduler thread's, reused: a decode step allocates nothing
  rows.seqs = seqs;
  rows.row0.assign(seqs.size() + 1, 0);
  rows.decode.clear(), rows.multi.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    rows.row0[i + 1] = rows.row0[i] + seqs[i].T;
    // A sequential step of several positions gets the whole pool, as a prompt chunk does.
    (seqs[i].T == 1 ? rows.decode : rows.multi).push_back(i);
    if (GdnRollback* rb = seqs[i].gdn_rollback) {
      const size_t n_linear = seqs[i].state->gdn.size();
      rb->before.resize(n_linear);
      rb->positions = seqs[i].T - 1;
      rb->inputs.resize(size_t(rb->positions) * n_linear * size_t(c_.gdn_input_floats()));
    }
  }
  const int64_t R = rows.total();
  if (R == 0) return;
  // Owned by the calling thread (the scheduler): grown once, reused every step.
  thread_local Buf x, a, out;
  x.resize(size_t(R * H)), a.resize(size_t(R * H)), out.resize(size_t(R * H));
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t t = 0; t < seqs[i].T; ++t)
      to_f32(w_.embed_tokens.dtype, w_.embed_tokens.row_ptr(seqs[i].tokens[t]), &x[size_t((rows.row0[i] + t) * H)], H);
  int full = 0, linear = 0;
  for (const LayerWeights& L : w_.layers) {
    ops::rms_norm(x.data(), R, H, L.input_layernorm.data(), true, c_.rms_norm_eps, a.data());
    if (L.type == LayerType::full_attention) attention_block(L.attn, full++, a.data(), rows, out.data());
    else delta_net_block(L.gdn, linear++, a.data(), rows, out.data());
    for (int64_t i = 0; i < R * H; ++i) x[size_t(i)] += out[size_t(i)];
    ops::rms_norm(x.data(), R, H, L.post_attention_layernorm.data(), true, c_.rms_norm_eps, a.data());
    if (c_.is_moe) moe_block(L.moe, a.data(), R, out.data(), stats);
    else mlp_block(L.mlp, a.data(), R, out.data());
    for (int64_t i = 0; i < R * H; ++i) x[size_t(i)] += out[size_t(i)];
  }
  for (const SeqStep& s : seqs) s.state->n_past += s.T;
  if (stats) stats->rows += R;
  // Final norm and lm_head only on the rows whose logits are wanted, gathered together.
  int64_t n = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t first = seqs[i].logits == LogitRows::all ? 0 : seqs[i].T - 1;
    if (seqs[i].logits == LogitRows::none) continue;
    for (int64_t t = first; t < seqs[i].T; ++t, ++n)
      std::copy_n(&x[size_t((rows.row0[i] + t) * H)], H, &a[size_t(n * H)]);
  }
  if (n == 0) return;
  ops::rms_norm(a.data(), n, H, w_.norm.data(), true, c_.rms_norm_eps, a.data());
  thread_local Buf logits;
  float* dst = nullptr;
  if (seqs.size() == 1) {
    dst = seqs[0].out;  // the common solo case writes straight into the caller's buffer
  } else {
    logits.resize(size_t(n * V));
    dst = logits.data();
  }
  ops::matmul(pool_, a.data(), n, w_.lm_head, dst);
  if (seqs.size() == 1) return;
  n = 0;
  for (const SeqStep& s : seqs) {
    if (s.logits == LogitRows::none) continue;
    const int64_t count = s.logits == LogitRows::all ? s.T : 1;
    std::copy_n(&logits[size_t(n * V)], count * V, s.out);
    n += count;
  }
}

// Gated full attention (§3.5): q_proj rows are per head [q(D) | gate(D)].
void Qwen35Model::attention_block(const AttentionWeights& w, int slot, const float* a, const Rows& rows,
                                  float* out) const {
  const int Hq = c_.num_attention_heads, Hkv = c_.num_key_value_heads, D = c_.head_dim;
  const int64_t kv_dim = c_.kv_dim(), R = rows.total(), qd = int64_t(Hq) * D;
  thread_local Buf qg, q, gate, k, v, o;
  qg.resize(size_t(R * 2 * qd)), q.resize(size_t(R * qd)), gate.resize(size_t(R * qd));
  k.resize(size_t(R * kv_dim)), v.resize(size_t(R * kv_dim)), o.resize(size_t(R * qd));
  const ops::MatmulJob qkv[] = {{&w.q_proj, a, R, qg.data()}, {&w.k_proj, a, R, k.data()}, {&w.v_proj, a, R, v.data()}};
  ops::matmul_group(pool_, qkv, 3);
  for (int64_t th = 0; th < R * Hq; ++th) {
    std::copy_n(&qg[size_t(th * 2 * D)], D, &q[size_t(th * D)]);
    std::copy_n(&qg[size_t(th * 2 * D + D)], D, &gate[size_t(th * D)]);
  }
  ops::rms_norm(q.data(), R * Hq, D, w.q_norm.data(), true, c_.rms_norm_eps, q.data());
  ops::rms_norm(k.data(), R * Hkv, D, w.k_norm.data(), true, c_.rms_norm_eps, k.data());
  for (size_t i = 0; i < rows.seqs.size(); ++i) {  // positions and cache writes are per sequence
    const SeqStep& s = rows.seqs[i];
    const int64_t r0 = rows.row0[i];
    ops::rope_neox(&q[size_t(r0 * qd)], s.T, Hq, D, c_.rotary_dim, s.state->n_past, c_.rope_theta);
    ops::rope_neox(&k[size_t(r0 * kv_dim)], s.T, Hkv, D, c_.rotary_dim, s.state->n_past, c_.rope_theta);
    for (int64_t t = 0; t < s.T; ++t)
      s.state->kv->write(slot, s.state->n_past + t, &k[size_t((r0 + t) * kv_dim)], &v[size_t((r0 + t) * kv_dim)]);
  }
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t page_tokens = rows.seqs.empty() ? 1 : rows.seqs[0].state->kv->page_tokens();
  float* const q_all = q.data();
  float* const o_all = o.data();
  for_each_sequence(pool_, rows.decode, rows.multi, [&](size_t i, ThreadPool* pool) {
    const SeqStep& s = rows.seqs[i];
    const int64_t r0 = rows.row0[i], n_kv = s.state->n_past + s.T;
    if (s.T == 1 || s.sequential) {  // decode: read K/V in place from the pages, a token at a time
      thread_local std::vector<const uint8_t*> kp, vp;
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t n = n_kv - s.T + 1 + t;  // this position and those before it
        s.state->kv->page_rows(slot, n, kp, vp);
        const ops::PagedKv view{kp.data(), vp.data(), page_tokens, kv_dim, s.state->dtype == CacheDtype::bf16};
        ops::attention_paged(pool, q_all + (r0 + t) * qd, view, 1, n, Hq, Hkv, D, scale, o_all + (r0 + t) * qd);
      }
      return;
    }
    thread_local Buf K, Vv;  // prefill: gather once, then T queries read contiguous f32 rows
    K.resize(size_t(n_kv * kv_dim)), Vv.resize(size_t(n_kv * kv_dim));
    s.state->kv->gather(slot, n_kv, K.data(), Vv.data());  // read back: prefill and decode see the same cache
    ops::attention(pool, q_all + r0 * qd, K.data(), Vv.data(), s.T, n_kv, Hq, Hkv, D, scale, o_all + r0 * qd);
  });
  for (int64_t i = 0; i < R * qd; ++i) o[size_t(i)] *= ops::sigmoid(gate[size_t(i)]);
  ops::matmul(pool_, o.data(), R, w.o_proj, out);
}

ops::GdnDecodeArgs Qwen35Model::gdn_decode_args(const DeltaNetWeights& w, const float* qkv, const float* z,
                                                const float* b, const float* a, DeltaNetState& st, CacheDtype dtype,
                                                float* out) const {
  return {c_.linear_num_key_heads, c_.linear_num_value_heads, c_.linear_key_head_dim, c_.linear_value_head_dim,
          c_.linear_conv_kernel_dim, qkv, z, b, a, w.conv1d_taps.data(), st.conv.data(), dtype == CacheDtype::bf16,
          w.A_log.data(), w.dt_bias.data(), w.norm.data(), c_.rms_norm_eps, st.recurrent.data(), out};
}

void Qwen35Model::roll_back_gdn(const GdnRollback& rb, int64_t positions, SequenceState& st, ThreadPool* pool) const {
  const size_t n_linear = st.gdn.size();
  const int64_t value_dim = c_.value_dim();
  thread_local Buf discarded;  // the replayed positions' outputs were computed by the step itself
  discarded.resize(size_t(value_dim));
  int linear = 0;
  for (const LayerWeights& L : w_.layers) {
    if (L.type == LayerType::full_attention) continue;
    DeltaNetState& s = st.gdn[size_t(linear)];
    s.conv = rb.before[size_t(linear)].conv;
    s.recurrent = rb.before[size_t(linear)].recurrent;
    for (int64_t t = 0; t < positions; ++t) {
      const GdnRecord<const float> in = gdn_record(rb.inputs.data(), c_, t, n_linear, linear);
      ops::gated_delta_net_decode(pool, gdn_decode_args(L.gdn, in.qkv, in.z, in.b, in.a, s, st.dtype, discarded.data()));
    }
    ++linear;
  }
}

// Gated DeltaNet (§3.6): conv + SiLU, L2 norm, gated delta rule, gated RMSNorm, out_proj.
void Qwen35Model::delta_net_block(const DeltaNetWeights& w, int linear, const float* a, const Rows& rows,
                                  float* out) const {
  const int Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim, K = c_.linear_conv_kernel_dim;
  const int64_t C = c_.conv_dim(), key_dim = c_.key_dim(), value_dim = c_.value_dim(), R = rows.total();
  thread_local Buf c, ch, z, b, alpha, conv_state, beta, g, o;
  c.resize(size_t(R * C)), ch.resize(size_t(R * C)), z.resize(size_t(R * value_dim));
  b.resize(size_t(R * Hv)), alpha.resize(size_t(R * Hv)), beta.resize(size_t(R * Hv)), g.resize(size_t(R * Hv));
  o.resize(size_t(R * value_dim)), conv_state.resize(size_t((K - 1) * C));
  const ops::MatmulJob in[] = {{&w.in_proj_qkv, a, R, c.data()},
                               {&w.in_proj_z, a, R, z.data()},
                               {&w.in_proj_b, a, R, b.data()},
                               {&w.in_proj_a, a, R, alpha.data()}};
  ops::matmul_group(pool_, in, 4);
  // Prompt chunks (T > 1): conv, norms and gates over their rows, then the chunked rule.
  for (size_t i : rows.multi) {
    if (rows.seqs[i].sequential) continue;  // the decode form below does its own conv and gates
    DeltaNetState& s = rows.seqs[i].state->gdn[size_t(linear)];
    const CacheDtype dtype = rows.seqs[i].state->dtype;
    const int64_t r0 = rows.row0[i], T = rows.seqs[i].T;
    s.load_conv(dtype, conv_state.data());
    ops::conv1d_silu(&c[size_t(r0 * C)], T, C, K, w.conv1d.data(), conv_state.data(), &ch[size_t(r0 * C)]);
    s.store_conv(dtype, conv_state.data());
    for (int64_t t = r0; t < r0 + T; ++t) {  // q and k heads, each L2-normalised; q also scaled by 1/√dk
      ops::l2_norm(&ch[size_t(t * C)], Hk, dk, 1e-6, 1.0f / std::sqrt(float(dk)));
      ops::l2_norm(&ch[size_t(t * C + key_dim)], Hk, dk, 1e-6, 1.0f);
    }
    for (int64_t t = r0; t < r0 + T; ++t)
      for (int j = 0; j < Hv; ++j) {
        const size_t x = size_t(t * Hv + j);
        const ops::GdnGates gates = ops::gdn_gates(alpha[x], b[x], w.A_log[size_t(j)], w.dt_bias[size_t(j)]);
        beta[x] = gates.beta, g[x] = gates.g;  // g ≤ 0: decay γ = e^g ≤ 1
      }
  }
  // The lambda may run on pool workers: it names this thread's buffers only through these.
  const float *const c_all = c.data(), *const ch_all = ch.data(), *const z_all = z.data();
  const float *const b_all = b.data(), *const alpha_all = alpha.data();
  const float *const beta_all = beta.data(), *const g_all = g.data();
  float* const o_all = o.data();
  for_each_sequence(pool_, rows.decode, rows.multi, [&](size_t i, ThreadPool* pool) {
    const SeqStep& s = rows.seqs[i];
    const int64_t r0 = rows.row0[i];
    DeltaNetState& st = s.state->gdn[size_t(linear)];
    if (s.T == 1 || s.sequential) {  // decode: conv … gated norm fused, one parallel section (ops.h)
      GdnRollback* rb = s.T > 1 ? s.gdn_rollback : nullptr;
      if (rb) {  // copies reuse the buffers' capacity: no allocation after the first
        rb->before[size_t(linear)].conv = st.conv;
        rb->before[size_t(linear)].recurrent = st.recurrent;
      }
      const size_t n_linear = s.state->gdn.size();
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t r = r0 + t;
        const float *qkv = c_all + r * C, *zr = z_all + r * value_dim, *br = b_all + r * Hv, *ar = alpha_all + r * Hv;
        if (rb && t < rb->positions) {
          const GdnRecord<float> rec = gdn_record(rb->inputs.data(), c_, t, n_linear, linear);
          std::copy_n(qkv, C, rec.qkv);
          std::copy_n(zr, value_dim, rec.z);
          std::copy_n(br, Hv, rec.b);
          std::copy_n(ar, Hv, rec.a);
        }
        ops::gated_delta_net_decode(pool, gdn_decode_args(w, qkv, zr, br, ar, st, s.state->dtype, o_all + r * value_dim));
      }
      return;
    }
    const float* chs = ch_all + r0 * C;
    const ops::DeltaRuleArgs args{s.T, Hk, Hv, dk, dv, chs, chs + key_dim, chs + 2 * key_dim, C, C, C,
                                  beta_all + r0 * Hv, g_all + r0 * Hv, st.recurrent.data(), o_all + r0 * value_dim};
    ops::gated_delta_rule_chunked(pool, args);
    ops::rms_norm_gated(o_all + r0 * value_dim, z_all + r0 * value_dim, s.T * Hv, dv, w.norm.data(),
                        c_.rms_norm_eps, o_all + r0 * value_dim);
  });
  ops::matmul(pool_, o.data(), R, w.out_proj, out);
}

// SwiGLU MLP (§3.7): down(silu(gate·a) ⊙ up·a).
void Qwen35Model::mlp_block(const MlpWeights& w, const float* a, int64_t T, float* out) const {
  const int64_t I = w.gate_proj.rows;
  thread_local Buf g, u;
  g.resize(size_t(T * I)), u.resize(size_t(T * I));
  const ops::SwigluJob gate_up{&w.gate_proj, &w.up_proj, a, T, g.data(), u.data(), g.data()};
  ops::matmul_swiglu_group(pool_, &gate_up, 1);
  ops::matmul(pool_, g.data(), T, w.down_proj, out);
}

// MoE (§3.8): softmax router, top-k renormalised, SwiGLU experts run on the tokens routed to
// them (gathered, so each expert is one matrix product; unselected experts are never read), plus
// the σ-gated shared expert. All gate/up products with their SwiGLU (routed and shared) form one
// parallel section and all down products a second: a decode step's experts are too small for a
// fork/join each. Scratch is per thread and only grows, so decode allocates nothing here.
void Qwen35Model::moe_block(const MoeWeights& w, const float* a, int64_t T, float* out, StepStats* stats) const {
  const int64_t H = c_.hidden_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  thread_local Buf router, weights, xa, gu, ya, s, sgu, sg;
  thread_local std::vector<int32_t> ids, count, start, fill;
  thread_local std::vector<ops::MatmulJob> jobs;
  thread_local std::vector<ops::SwigluJob> swiglu;
  router.resize(size_t(T * E));
  weights.resize(size_t(T * k));
  ids.resize(size_t(T * k));
  const bool shared = w.has_shared_expert;
  const int64_t SI = shared ? w.shared_expert.gate_proj.rows : 0;
  if (shared) {
    sgu.resize(size_t(T * 2 * SI));
    s.resize(size_t(T * H));
    sg.resize(size_t(T));
  }
  // A few tokens (decode): the router is too small to split on its own (one thread would read
  // it between two sections), so it shares a section with the shared expert, which needs only
  // `a` too. Prompt chunks keep the shared expert with the routed ones.
  const bool shared_first = shared && T <= 8;
  swiglu.clear();
  swiglu.push_back({&w.router, nullptr, a, T, router.data(), nullptr, nullptr});
  if (shared_first) {
    swiglu.push_back({&w.shared_expert_gate, nullptr, a, T, sg.data(), nullptr, nullptr});
    swiglu.push_back({&w.shared_expert.gate_proj, &w.shared_expert.up_proj, a, T, sgu.data(), sgu.data() + T * SI,
                      sgu.data()});
  }
  ops::matmul_swiglu_group(pool_, swiglu.data(), int(swiglu.size()));
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
  if (stats) {
    ++stats->moe_layers;
    for (int e = 0; e < E; ++e) stats->experts_read += start[size_t(e) + 1] > start[size_t(e)];
  }
  // The expert size comes from the tensors: the config may omit moe_intermediate_size (0).
  const int64_t I = w.experts[0].gate_proj.rows, R = T * k;
  xa.resize(size_t(R * H));
  gu.resize(size_t(R * 2 * I));
  ya.resize(size_t(R * H));
  // An expert with one row reads it in place (in decode, every expert): matmul_group then sees
  // one input for all of them and quantizes it once. Others get their rows gathered.
  auto row_of = [&](int64_t r) { return a + (slot_of_row[size_t(r)] / k) * H; };
  for (int e = 0; e < E; ++e)
    if (start[size_t(e) + 1] - start[size_t(e)] > 1)
      for (int64_t r = start[size_t(e)]; r < start[size_t(e) + 1]; ++r) std::copy_n(row_of(r), H, &xa[size_t(r * H)]);
  // Gate and up with SwiGLU applied in the same section: outputs side by side per expert, [n_e][I]
  // gate (then h, in place) and [n_e][I] up.
  swiglu.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t n = start[size_t(e) + 1] - start[size_t(e)];
    if (n == 0) continue;
    const float* x = n == 1 ? row_of(start[size_t(e)]) : &xa[size_t(start[size_t(e)] * H)];
    float* g = &gu[size_t(start[size_t(e)] * 2 * I)];
    swiglu.push_back({&w.experts[size_t(e)].gate_proj, &w.experts[size_t(e)].up_proj, x, n, g, g + n * I, g});
  }
  if (shared && !shared_first) {
    swiglu.push_back({&w.shared_expert.gate_proj, &w.shared_expert.up_proj, a, T, sgu.data(), sgu.data() + T * SI,
                      sgu.data()});
    ops::matmul(pool_, a, T, w.shared_expert_gate, sg.data());  // one row
  }
  ops::matmul_swiglu_group(pool_, swiglu.data(), int(swiglu.size()));
  jobs.clear();
  for (int e = 0; e < E; ++e) {
    const int64_t n = start[size_t(e) + 1] - start[size_t(e)];
    if (n == 0) continue;
    jobs.push_back({&w.experts[size_t(e)].down_proj, &gu[size_t(start[size_t(e)] * 2 * I)], n,
                    &ya[size_t(start[size_t(e)] * H)]});
  }
  if (shared) jobs.push_back({&w.shared_expert.down_proj, sgu.data(), T, s.data()});
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
