#include "engine/make_tiny.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tiny_tokenizer.h"

namespace kiln::engine {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

enum class Init { matrix, norm_zero_centred, norm_one, a_log, dt_bias };

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype;
  Init init;
  int64_t fan_in = 1;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::vector<Spec> tensor_list(const TinyModelOptions& o) {
  const std::string p = "model.language_model.";
  const Dtype d = o.dtype;
  const int64_t H = o.hidden, D = o.head_dim, Hq = o.heads, Hkv = o.kv_heads;
  const int64_t key_dim = int64_t(o.linear_key_heads) * o.linear_key_head_dim;
  const int64_t value_dim = int64_t(o.linear_value_heads) * o.linear_value_head_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim, Hv = o.linear_value_heads;
  std::vector<Spec> s;
  auto mat = [&](const std::string& n, std::vector<int64_t> shape) { s.push_back({n, shape, d, Init::matrix, shape.back()}); };
  mat(p + "embed_tokens.weight", {o.vocab, H});
  s.back().fan_in = 1;  // embedding rows: unit variance
  mat("lm_head.weight", {o.vocab, H});
  s.push_back({p + "norm.weight", {H}, d, Init::norm_zero_centred});
  for (int i = 0; i < o.layers; ++i) {
    const std::string l = p + "layers." + std::to_string(i) + ".";
    s.push_back({l + "input_layernorm.weight", {H}, d, Init::norm_zero_centred});
    s.push_back({l + "post_attention_layernorm.weight", {H}, d, Init::norm_zero_centred});
    if ((i + 1) % o.full_attention_interval == 0) {
      mat(l + "self_attn.q_proj.weight", {Hq * D * 2, H});
      mat(l + "self_attn.k_proj.weight", {Hkv * D, H});
      mat(l + "self_attn.v_proj.weight", {Hkv * D, H});
      mat(l + "self_attn.o_proj.weight", {H, Hq * D});
      s.push_back({l + "self_attn.q_norm.weight", {D}, d, Init::norm_zero_centred});
      s.push_back({l + "self_attn.k_norm.weight", {D}, d, Init::norm_zero_centred});
    } else {
      const std::string g = l + "linear_attn.";
      mat(g + "in_proj_qkv.weight", {conv_dim, H});
      mat(g + "in_proj_z.weight", {value_dim, H});
      mat(g + "in_proj_b.weight", {Hv, H});
      mat(g + "in_proj_a.weight", {Hv, H});
      s.push_back({g + "conv1d.weight", {conv_dim, 1, o.conv_kernel}, d, Init::matrix, o.conv_kernel});
      s.push_back({g + "A_log", {Hv}, Dtype::f32, Init::a_log});
      s.push_back({g + "dt_bias", {Hv}, d, Init::dt_bias});
      s.push_back({g + "norm.weight", {o.linear_value_head_dim}, d, Init::norm_one});
      mat(g + "out_proj.weight", {H, value_dim});
    }
    const std::string m = l + "mlp.";
    if (!o.moe) {
      mat(m + "gate_proj.weight", {o.intermediate, H});
      mat(m + "up_proj.weight", {o.intermediate, H});
      mat(m + "down_proj.weight", {H, o.intermediate});
      continue;
    }
    const int64_t I = o.moe_intermediate, E = o.experts;
    mat(m + "gate.weight", {E, H});
    if (o.per_expert) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        mat(x + "gate_proj.weight", {I, H});
        mat(x + "up_proj.weight", {I, H});
        mat(x + "down_proj.weight", {H, I});
      }
    } else {
      mat(m + "experts.gate_up_proj", {E, 2 * I, H});
      mat(m + "experts.down_proj", {E, H, I});
    }
    if (o.shared_expert_intermediate > 0) {
      const int64_t S = o.shared_expert_intermediate;
      mat(m + "shared_expert.gate_proj.weight", {S, H});
      mat(m + "shared_expert.up_proj.weight", {S, H});
      mat(m + "shared_expert.down_proj.weight", {H, S});
      mat(m + "shared_expert_gate.weight", {1, H});
    }
  }
  return s;
}

// Fills one tensor's values (f32) from its name and the seed.
void fill(const Spec& t, uint64_t seed, std::vector<float>& v) {
  uint64_t st = hash_name(t.name, seed);
  auto uni = [&] { return double(splitmix(st) >> 11) * (1.0 / 9007199254740992.0); };  // [0,1)
  v.resize(size_t(t.numel()));
  const double a = std::sqrt(3.0 / double(t.fan_in));  // U(−a, a) has variance 1/fan_in
  for (auto& x : v) {
    switch (t.init) {
      case Init::matrix: x = float((2 * uni() - 1) * a); break;
      case Init::norm_zero_centred: x = float((2 * uni() - 1) * 0.1); break;
      case Init::norm_one: x = float(1.0 + (2 * uni() - 1) * 0.1); break;
      case Init::a_log: x = float(std::log(1.0 + 15.0 * uni())); break;
      case Init::dt_bias: x = float((2 * uni() - 1) * 0.5); break;
    }
  }
}

Status write_shard(const fs::path& path, const std::vector<const Spec*>& specs, uint64_t seed) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const Spec* t : specs) {
    const uint64_t n = uint64_t(t->numel()) * dtype_size(t->dtype);
    header[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(path.string() + ": cannot create");
  const uint64_t hl = h.size();
  out.write(reinterpret_cast<const char*>(&hl), 8);
  out.write(h.data(), std::streamsize(h.size()));
  // Tensors in the order nlohmann lays out the header (sorted by name) — offsets follow `specs`.
  std::vector<float> v;
  std::vector<uint16_t> half;
  for (const Spec* t : specs) {
    fill(*t, seed, v);
    if (t->dtype == Dtype::f32) {
      out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
    } else {
      half.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) half[i] = f32_to_bf16(v[i]);
      out.write(reinterpret_cast<const char*>(half.data()), std::streamsize(half.size() * 2));
    }
  }
  if (!out) return make_error(path.string() + ": write failed");
  return {};
}

json config_json(const TinyModelOptions& o, const json& eos) {
  json layer_types = json::array();
  for (int i = 0; i < o.layers; ++i)
    layer_types.push_back((i + 1) % o.full_attention_interval == 0 ? "full_attention" : "linear_attention");
  const int rot = int(std::lround(o.head_dim * o.partial_rotary_factor)) / 2;  // frequencies
  const int sec_t = (rot + 2) / 3, sec_h = (rot + 1) / 3, sec_w = rot - sec_t - sec_h;
  json t = {
      {"model_type", o.moe ? "qwen3_5_moe_text" : "qwen3_5_text"},
      {"vocab_size", o.vocab}, {"hidden_size", o.hidden}, {"num_hidden_layers", o.layers},
      {"layer_types", layer_types}, {"full_attention_interval", o.full_attention_interval},
      {"num_attention_heads", o.heads}, {"num_key_value_heads", o.kv_heads}, {"head_dim", o.head_dim},
      {"attn_output_gate", true}, {"attention_bias", false},
      {"linear_num_key_heads", o.linear_key_heads}, {"linear_num_value_heads", o.linear_value_heads},
      {"linear_key_head_dim", o.linear_key_head_dim}, {"linear_value_head_dim", o.linear_value_head_dim},
      {"linear_conv_kernel_dim", o.conv_kernel}, {"hidden_act", "silu"}, {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", o.max_position_embeddings}, {"tie_word_embeddings", false},
      {"partial_rotary_factor", o.partial_rotary_factor}, {"mamba_ssm_dtype", "float32"},
      {"dtype", o.dtype == Dtype::f32 ? "float32" : "bfloat16"},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", o.rope_theta},
                           {"partial_rotary_factor", o.partial_rotary_factor},
                           {"mrope_section", {sec_t, sec_h, sec_w}}, {"mrope_interleaved", true}}},
      {"bos_token_id", nullptr}, {"eos_token_id", eos}, {"pad_token_id", nullptr},
      {"mtp_num_hidden_layers", 0}};
  if (o.moe) {
    t["num_experts"] = o.experts;
    t["num_experts_per_tok"] = o.top_k;
    t["moe_intermediate_size"] = o.moe_intermediate;
    t["shared_expert_intermediate_size"] = o.shared_expert_intermediate;
  } else {
    t["intermediate_size"] = o.intermediate;
  }
  return {{"architectures", {o.moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"}},
          {"model_type", o.moe ? "qwen3_5_moe" : "qwen3_5"},
          {"text_config", t},
          {"tie_word_embeddings", false},
          {"transformers_version", "4.57.1"}};
}

}  // namespace

Status make_tiny_model(const std::string& dir, const TinyModelOptions& o) {
  if (o.dtype != Dtype::bf16 && o.dtype != Dtype::f32) return make_error("make-tiny: dtype must be bf16 or f32");
  if (o.layers < 1 || o.hidden < 1 || o.vocab < 2 || o.heads < 1 || o.kv_heads < 1 || o.heads % o.kv_heads)
    return make_error("make-tiny: layers, hidden, vocab, heads must be positive and kv_heads must divide heads");
  if (o.linear_value_heads % o.linear_key_heads) return make_error("make-tiny: linear value heads must be a multiple of key heads");
  if (o.moe && (o.top_k < 1 || o.top_k > o.experts)) return make_error("make-tiny: top-k must be in 1..experts");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(dir + ": cannot create directory: " + ec.message());
  // With a tokenizer, eos ids are its <|im_end|> and <|endoftext|> (as generation_config lists
  // them for the real models); without one, the last id stands in.
  json eos = o.vocab - 1;
  fs::remove(fs::path(dir) / "tokenizer.json", ec);
  fs::remove(fs::path(dir) / "tokenizer_config.json", ec);
  if (o.tokenizer && size_t(o.vocab) >= kTinyTokenizerMinVocab && size_t(o.vocab) <= kTinyTokenizerMaxVocab) {
    TinyTokenizerInfo info = write_tiny_tokenizer(dir, size_t(o.vocab));
    if (!info.ok()) return make_error("make-tiny: " + info.error);
    eos = json::array({info.im_end, info.endoftext});
  }
  {
    std::ofstream cfg(fs::path(dir) / "config.json");
    cfg << config_json(o, eos).dump(2) << "\n";
    if (!cfg) return make_error(dir + "/config.json: write failed");
  }
  std::vector<Spec> specs = tensor_list(o);
  std::map<std::string, const Spec*> sorted;  // the header is sorted by name; keep data in that order
  for (const auto& s : specs) sorted[s.name] = &s;
  const int shards = std::max(1, o.shards);
  std::vector<std::vector<const Spec*>> parts(static_cast<size_t>(shards));
  int64_t total = 0, done = 0;
  for (const auto& [n, s] : sorted) total += s->numel();
  for (const auto& [n, s] : sorted) {
    parts[size_t(std::min<int64_t>(shards - 1, done * shards / std::max<int64_t>(1, total)))].push_back(s);
    done += s->numel();
  }
  json weight_map = json::object();
  for (int i = 0; i < shards; ++i) {
    char name[64];
    if (shards == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, shards);
    Status st = write_shard(fs::path(dir) / name, parts[size_t(i)], o.seed);
    if (!st) return st;
    for (const Spec* s : parts[size_t(i)]) weight_map[s->name] = name;
  }
  fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
  if (shards > 1) {
    std::ofstream idx(fs::path(dir) / "model.safetensors.index.json");
    idx << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2) << "\n";
  }
  return {};
}

}  // namespace kiln::engine
