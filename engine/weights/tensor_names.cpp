#include "engine/weights/tensor_names.h"

#include <map>
#include <set>

namespace kiln::engine {
namespace {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// Claims tensors by canonical name ("layers.3.self_attn.q_proj.weight", "lm_head.weight").
class Binder {
 public:
  Binder(const Checkpoint& ck, std::string dir) : ck_(ck), dir_(std::move(dir)) {
    for (const auto& [name, info] : ck.tensors()) {
      std::string canon = name;
      bool skipped = false;
      for (const char* skip : {"model.visual.", "visual.", "mtp.", "model.mtp."})
        if (starts_with(name, skip)) skipped = true;
      if (skipped) continue;
      for (const char* p : {"model.language_model.", "language_model.model.", "language_model.", "model."})
        if (starts_with(name, p)) {
          canon = name.substr(std::string(p).size());
          if (canon != "lm_head.weight" && prefix_.empty()) prefix_ = p;
          break;
        }
      by_canon_[canon] = &info;
    }
  }

  bool has(const std::string& canon) const { return by_canon_.count(canon) > 0; }
  // Dimension `dim` of a tensor's stored shape, or 0 when absent (to infer sizes a config omits).
  int64_t dim(const std::string& canon, size_t d) const {
    auto it = by_canon_.find(canon);
    return it == by_canon_.end() || it->second->shape.size() <= d ? 0 : it->second->shape[d];
  }

  std::string stored_name(const std::string& canon) const {
    auto it = by_canon_.find(canon);
    if (it != by_canon_.end()) return it->second->name;
    return (canon == "lm_head.weight" ? "" : (prefix_.empty() ? "model.language_model." : prefix_)) + canon;
  }

  // Accepts any of `shapes` (first is the canonical one, used in the message).
  Result<const TensorInfo*> claim(const std::string& canon, const std::vector<Shape>& shapes) {
    auto it = by_canon_.find(canon);
    if (it == by_canon_.end())
      return make_error(dir_ + ": missing tensor " + stored_name(canon) + " (expected " + shape_str(shapes[0]) + ")");
    const TensorInfo* t = it->second;
    if (t->dtype == Dtype::unsupported)
      return make_error(t->file + ": tensor " + t->name + " has unsupported dtype " + t->dtype_string +
                        " (supported: BF16, F16, F32)");
    bool ok = false;
    for (const auto& s : shapes) ok = ok || t->shape == s;
    if (!ok)
      return make_error(t->file + ": tensor " + t->name + " has shape " + t->shape_string() + ", expected " +
                        shape_str(shapes[0]));
    claimed_.insert(canon);
    n_params_ += t->numel();
    n_bytes_ += int64_t(t->nbytes);
    return t;
  }

  Status matrix(const std::string& canon, int64_t rows, int64_t cols, Matrix& out) {
    auto t = claim(canon, {{rows, cols}});
    if (!t) return make_error(t.error());
    out = Matrix{(*t)->data, (*t)->dtype, rows, cols};
    return {};
  }

  Status vector(const std::string& canon, const std::vector<Shape>& shapes, std::vector<float>& out) {
    auto t = claim(canon, shapes);
    if (!t) return make_error(t.error());
    out.resize(size_t((*t)->numel()));
    to_f32((*t)->dtype, (*t)->data, out.data(), (*t)->numel());
    return {};
  }

  // A packed [E][rows][cols] tensor, as E views.
  Result<const TensorInfo*> packed(const std::string& canon, int64_t E, int64_t rows, int64_t cols) {
    return claim(canon, {{E, rows, cols}});
  }

  std::vector<std::string> unclaimed() const {
    std::vector<std::string> out;
    for (const auto& [canon, t] : by_canon_)
      if (!claimed_.count(canon)) out.push_back(t->file + ": tensor " + t->name + " is not used by the text model");
    return out;
  }
  int64_t n_params() const { return n_params_; }
  int64_t n_bytes() const { return n_bytes_; }

 private:
  const Checkpoint& ck_;
  std::string dir_;
  std::string prefix_;
  std::map<std::string, const TensorInfo*> by_canon_;
  std::set<std::string> claimed_;
  int64_t n_params_ = 0;
  int64_t n_bytes_ = 0;
};

#define KILN_CHECK(expr)                           \
  do {                                             \
    Status _s = (expr);                            \
    if (!_s.ok()) return make_error(_s.error());   \
  } while (0)

Status bind_mlp(Binder& b, const std::string& p, int64_t H, int64_t I, MlpWeights& m) {
  KILN_CHECK(b.matrix(p + "gate_proj.weight", I, H, m.gate_proj));
  KILN_CHECK(b.matrix(p + "up_proj.weight", I, H, m.up_proj));
  KILN_CHECK(b.matrix(p + "down_proj.weight", H, I, m.down_proj));
  return {};
}

Status bind_moe(Binder& b, const ModelConfig& c, const std::string& p, MoeWeights& m) {
  const int64_t H = c.hidden_size, E = c.num_experts;
  const bool packed = b.has(p + "experts.gate_up_proj");
  // Sizes a config leaves out are taken from the tensors (a silently missing shared expert would
  // give fluent but wrong output).
  int64_t I = c.moe_intermediate_size;
  if (I == 0) I = packed ? b.dim(p + "experts.gate_up_proj", 1) / 2 : b.dim(p + "experts.0.gate_proj.weight", 0);
  if (I <= 0) return make_error("config: moe_intermediate_size is missing and " + b.stored_name(p + "experts.gate_up_proj") + " does not show it");
  int64_t S = c.shared_expert_intermediate_size;
  if (S < 0) S = b.dim(p + "shared_expert.gate_proj.weight", 0);
  KILN_CHECK(b.matrix(p + "gate.weight", E, H, m.router));
  m.experts.resize(size_t(E));
  if (packed) {  // packed: rows 0..I−1 gate, I..2I−1 up
    auto gu = b.packed(p + "experts.gate_up_proj", E, 2 * I, H);
    if (!gu) return make_error(gu.error());
    auto dn = b.packed(p + "experts.down_proj", E, H, I);
    if (!dn) return make_error(dn.error());
    for (int64_t e = 0; e < E; ++e) {
      Matrix all{(*gu)->data, (*gu)->dtype, E * 2 * I, H};
      m.experts[size_t(e)].gate_proj = all.row_slice(e * 2 * I, I);
      m.experts[size_t(e)].up_proj = all.row_slice(e * 2 * I + I, I);
      Matrix down{(*dn)->data, (*dn)->dtype, E * H, I};
      m.experts[size_t(e)].down_proj = down.row_slice(e * H, H);
    }
  } else {
    for (int64_t e = 0; e < E; ++e)
      KILN_CHECK(bind_mlp(b, p + "experts." + std::to_string(e) + ".", H, I, m.experts[size_t(e)]));
  }
  m.has_shared_expert = S > 0;
  if (m.has_shared_expert) {
    KILN_CHECK(bind_mlp(b, p + "shared_expert.", H, S, m.shared_expert));
    KILN_CHECK(b.matrix(p + "shared_expert_gate.weight", 1, H, m.shared_expert_gate));
  }
  return {};
}

Status bind_layer(Binder& b, const ModelConfig& c, int i, LayerWeights& l) {
  const std::string p = "layers." + std::to_string(i) + ".";
  const int64_t H = c.hidden_size;
  l.type = c.layer_types[size_t(i)];
  KILN_CHECK(b.vector(p + "input_layernorm.weight", {{H}}, l.input_layernorm));
  KILN_CHECK(b.vector(p + "post_attention_layernorm.weight", {{H}}, l.post_attention_layernorm));
  if (l.type == LayerType::full_attention) {
    const std::string a = p + "self_attn.";
    const int64_t D = c.head_dim, Hq = c.num_attention_heads;
    KILN_CHECK(b.matrix(a + "q_proj.weight", c.q_proj_rows(), H, l.attn.q_proj));
    KILN_CHECK(b.matrix(a + "k_proj.weight", c.kv_dim(), H, l.attn.k_proj));
    KILN_CHECK(b.matrix(a + "v_proj.weight", c.kv_dim(), H, l.attn.v_proj));
    KILN_CHECK(b.matrix(a + "o_proj.weight", H, Hq * D, l.attn.o_proj));
    KILN_CHECK(b.vector(a + "q_norm.weight", {{D}}, l.attn.q_norm));
    KILN_CHECK(b.vector(a + "k_norm.weight", {{D}}, l.attn.k_norm));
  } else {
    const std::string g = p + "linear_attn.";
    const int64_t Hv = c.linear_num_value_heads, K = c.linear_conv_kernel_dim;
    KILN_CHECK(b.matrix(g + "in_proj_qkv.weight", c.conv_dim(), H, l.gdn.in_proj_qkv));
    KILN_CHECK(b.matrix(g + "in_proj_z.weight", c.value_dim(), H, l.gdn.in_proj_z));
    KILN_CHECK(b.matrix(g + "in_proj_b.weight", Hv, H, l.gdn.in_proj_b));
    KILN_CHECK(b.matrix(g + "in_proj_a.weight", Hv, H, l.gdn.in_proj_a));
    KILN_CHECK(b.matrix(g + "out_proj.weight", H, c.value_dim(), l.gdn.out_proj));
    KILN_CHECK(b.vector(g + "conv1d.weight", {{c.conv_dim(), 1, K}, {c.conv_dim(), K}}, l.gdn.conv1d));
    l.gdn.conv1d_taps.resize(l.gdn.conv1d.size());
    for (int64_t ch = 0; ch < c.conv_dim(); ++ch)
      for (int64_t s = 0; s < K; ++s)
        l.gdn.conv1d_taps[size_t(s * c.conv_dim() + ch)] = l.gdn.conv1d[size_t(ch * K + s)];
    KILN_CHECK(b.vector(g + "A_log", {{Hv}}, l.gdn.A_log));
    KILN_CHECK(b.vector(g + "dt_bias", {{Hv}}, l.gdn.dt_bias));
    KILN_CHECK(b.vector(g + "norm.weight", {{c.linear_value_head_dim}}, l.gdn.norm));
  }
  if (c.is_moe) return bind_moe(b, c, p + "mlp.", l.moe);
  return bind_mlp(b, p + "mlp.", H, c.intermediate_size, l.mlp);
}

}  // namespace

Result<ModelWeights> bind_weights(const ModelConfig& c, const Checkpoint& ck, const std::string& dir) {
  Binder b(ck, dir);
  ModelWeights w;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  KILN_CHECK(b.matrix("embed_tokens.weight", V, H, w.embed_tokens));
  KILN_CHECK(b.vector("norm.weight", {{H}}, w.norm));
  if (b.has("lm_head.weight") || !c.tie_word_embeddings) {
    KILN_CHECK(b.matrix("lm_head.weight", V, H, w.lm_head));
  } else {
    w.lm_head = w.embed_tokens;
  }
  w.layers.resize(size_t(c.num_hidden_layers));
  for (int i = 0; i < c.num_hidden_layers; ++i) KILN_CHECK(bind_layer(b, c, i, w.layers[size_t(i)]));
  w.n_params = b.n_params();
  int64_t inactive = 0, inactive_bytes = 0;
  if (c.is_moe) {
    const Matrix& down = w.layers[0].moe.experts[0].down_proj;  // [H][I]
    inactive = int64_t(c.num_hidden_layers) * (c.num_experts - c.num_experts_per_tok) * 3 * H * down.cols;
    inactive_bytes = inactive * int64_t(dtype_size(down.dtype));
  }
  // One embedding row is read per token, unless the lm_head is the embedding (tied): then the
  // whole matrix is read as the head, and it is counted once in n_params.
  const int64_t unread_rows = w.lm_head.data == w.embed_tokens.data ? 0 : V - 1;
  w.n_params_active = w.n_params - inactive - unread_rows * H;
  w.n_bytes = b.n_bytes();
  w.n_bytes_active = w.n_bytes - inactive_bytes - unread_rows * H * int64_t(dtype_size(w.embed_tokens.dtype));
  w.warnings = b.unclaimed();
  return w;
}

}  // namespace kiln::engine
