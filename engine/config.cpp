#include "engine/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace kiln::engine {
namespace {

using nlohmann::json;

// Reads fields from the LM section (text_config or top level), naming the field in errors.
class Reader {
 public:
  Reader(const json& section, std::string prefix, std::string source)
      : s_(section), prefix_(std::move(prefix)), source_(std::move(source)) {}

  std::string where(const char* key) const { return source_ + ": " + prefix_ + key; }

  // Every read checks the JSON type first: nlohmann's get<> throws on a mismatch (an abort
  // outside a try) or converts silently (true -> 1), and a config is outside input.
  template <typename T>
  Status get(const char* key, T& out, bool required) const {
    return read(s_, where(key), key, out, required);
  }

  // The same for a field of another object (the top level, rope_parameters), named by `where`.
  template <typename T>
  static Status read(const json& obj, const std::string& where, const char* key, T& out, bool required) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) return make_error(where + " is missing");
      return {};
    }
    bool type_ok;
    if constexpr (std::is_same_v<T, bool>) type_ok = it->is_boolean();
    else if constexpr (std::is_same_v<T, std::string>) type_ok = it->is_string();
    else type_ok = it->is_number();
    if (!type_ok) return make_error(where + " has the wrong type (" + it->dump() + ")");
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // get<int> narrows silently (4294967300 layers -> 4, head_dim 32.7 -> 32): a count must be
      // an integer (4096.0 is one) that fits the field.
      using Lim = std::numeric_limits<T>;
      bool fits;
      if (it->is_number_unsigned()) fits = it->template get<uint64_t>() <= uint64_t(Lim::max());
      else if (it->is_number_integer()) fits = it->template get<int64_t>() >= int64_t(Lim::min()) &&
                                               it->template get<int64_t>() <= int64_t(Lim::max());
      else {
        const double d = it->template get<double>();
        if (d != std::trunc(d)) return make_error(where + " = " + it->dump() + " is not an integer");
        static_assert(std::is_signed_v<T>);
        fits = d >= double(Lim::min()) && d < -double(Lim::min());  // -min: max + 1, exact in a double
      }
      if (!fits) return make_error(where + " = " + it->dump() + " is out of range");
    }
    out = it->template get<T>();
    return {};
  }

  Status range(const char* key, double v, double lo, double hi, const std::string& why) const {
    if (v < lo || v > hi || std::isnan(v)) {
      std::ostringstream os;
      os << where(key) << " = " << v << " is out of range (" << why << ")";
      return make_error(os.str());
    }
    return {};
  }

  const json& section() const { return s_; }

 private:
  const json& s_;
  std::string prefix_;
  std::string source_;
};

#define KILN_TRY(expr)            \
  do {                            \
    Status _s = (expr);           \
    if (!_s.ok()) return make_error(_s.error()); \
  } while (0)

// kiln implements plain partial NeoX RoPE, which is what Qwen3.5's interleaved M-RoPE is for text
// (model-spec §1.3). Any other scaling (yarn, linear, dynamic, ...) changes the frequencies, so a
// config asking for one is refused rather than run with the wrong positions. Accepted: the new
// form {rope_type: "default", rope_theta, partial_rotary_factor, mrope_section, mrope_interleaved}
// and the old {type: "mrope", mrope_section}.
Status check_rope_kind(const json& rope, const std::string& where) {
  if (!rope.is_object()) return make_error(where + " has the wrong type (" + rope.dump() + ")");
  for (const char* key : {"rope_type", "type"}) {
    auto it = rope.find(key);
    if (it == rope.end() || it->is_null()) continue;
    if (!it->is_string() || (*it != "default" && *it != "mrope"))
      return make_error(where + "." + key + " = " + it->dump() +
                        " is not supported (kiln implements \"default\" and \"mrope\" RoPE, no scaling)");
  }
  if (auto it = rope.find("mrope_section"); it != rope.end() && !it->is_null()) {
    bool ok = it->is_array();
    for (const auto& e : *it) ok = ok && e.is_number_unsigned();
    if (!ok) return make_error(where + ".mrope_section = " + it->dump() + ": expected a list of section sizes");
  }
  if (auto it = rope.find("mrope_interleaved"); it != rope.end() && !it->is_null() && !it->is_boolean())
    return make_error(where + ".mrope_interleaved has the wrong type (" + it->dump() + ")");
  for (const auto& [key, value] : rope.items()) {
    static const char* const known[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor",
                                        "mrope_section", "mrope_interleaved"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known) && !value.is_null())
      return make_error(where + "." + key + " = " + value.dump() +
                        " is not supported (a RoPE scaling parameter; kiln implements unscaled RoPE)");
  }
  return {};
}

// Reads `key` of `obj` (absent/null: nothing) as one token id or a list of them into `out`.
Status parse_token_ids(const json& obj, const char* key, const std::string& where, std::vector<int64_t>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  auto one = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return make_error(where + " = " + it->dump() + ": expected a token id or a list of token ids");
    out.push_back(v.get<int64_t>());
    return {};
  };
  if (!it->is_array()) return one(*it);
  for (const auto& e : *it) KILN_TRY(one(e));
  return {};
}

}  // namespace

int ModelConfig::n_full_layers() const {
  int n = 0;
  for (LayerType t : layer_types) n += t == LayerType::full_attention;
  return n;
}
int ModelConfig::n_linear_layers() const { return num_hidden_layers - n_full_layers(); }

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return make_error(source + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return make_error(source + ": top level is not a JSON object");
  const bool nested = root.contains("text_config") && !root["text_config"].is_null();
  if (nested && !root["text_config"].is_object())
    return make_error(source + ": text_config has the wrong type (" + root["text_config"].dump() + ")");
  const json& s = nested ? root["text_config"] : root;
  Reader r(s, nested ? "text_config." : "", source);

  ModelConfig c;
  std::string text_type;
  KILN_TRY(r.get("model_type", text_type, false));
  c.model_type = text_type;
  KILN_TRY(Reader::read(root, source + ": model_type", "model_type", c.model_type, false));
  if (c.model_type.empty()) c.model_type = text_type;
  const bool moe_type = c.model_type.rfind("qwen3_5_moe", 0) == 0 || text_type.rfind("qwen3_5_moe", 0) == 0;
  const bool dense_type = !moe_type && (c.model_type.rfind("qwen3_5", 0) == 0 || text_type.rfind("qwen3_5", 0) == 0);
  if (!moe_type && !dense_type) {
    return make_error(source + ": model_type \"" + c.model_type +
                      "\" is not supported (expected qwen3_5_moe or qwen3_5)");
  }
  c.is_moe = moe_type;

  KILN_TRY(r.get("vocab_size", c.vocab_size, true));
  KILN_TRY(r.range("vocab_size", double(c.vocab_size), 1, 1e8, "1..1e8"));
  KILN_TRY(r.get("hidden_size", c.hidden_size, true));
  KILN_TRY(r.range("hidden_size", double(c.hidden_size), 1, 1 << 16, "1..65536"));
  KILN_TRY(r.get("num_hidden_layers", c.num_hidden_layers, true));
  KILN_TRY(r.range("num_hidden_layers", c.num_hidden_layers, 1, 1024, "1..1024"));
  KILN_TRY(r.get("rms_norm_eps", c.rms_norm_eps, false));
  KILN_TRY(r.range("rms_norm_eps", c.rms_norm_eps, 0, 1, "0..1"));
  c.max_position_embeddings = 262144;
  KILN_TRY(r.get("max_position_embeddings", c.max_position_embeddings, false));
  KILN_TRY(r.range("max_position_embeddings", double(c.max_position_embeddings), 1, 1e9, "1..1e9"));
  KILN_TRY(Reader::read(root, source + ": tie_word_embeddings", "tie_word_embeddings", c.tie_word_embeddings, false));
  KILN_TRY(r.get("tie_word_embeddings", c.tie_word_embeddings, false));
  KILN_TRY(r.get("dtype", c.dtype, false));
  KILN_TRY(r.get("torch_dtype", c.dtype, false));

  // eos_token_id: an int or a list of ints, in text_config or at the top level.
  // A stop id of the wrong type would silently never stop generation: it is an error.
  for (const json* sec : std::initializer_list<const json*>{&s, &root}) {
    if (!c.eos_token_ids.empty()) break;
    const std::string where = sec == &s ? r.where("eos_token_id") : source + ": eos_token_id";
    KILN_TRY(parse_token_ids(*sec, "eos_token_id", where, c.eos_token_ids));
  }
  KILN_TRY(r.get("bos_token_id", c.bos_token_id, false));

  // Layer layout: explicit layer_types, else full_attention_interval (default 4).
  if (s.contains("layer_types") && !s["layer_types"].is_null()) {
    const json& lt = s["layer_types"];
    if (!lt.is_array() || int(lt.size()) != c.num_hidden_layers) {
      return make_error(r.where("layer_types") + " must list num_hidden_layers (" +
                        std::to_string(c.num_hidden_layers) + ") entries, has " +
                        std::to_string(lt.is_array() ? lt.size() : 0));
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "linear_attention") c.layer_types.push_back(LayerType::linear_attention);
      else if (t == "full_attention") c.layer_types.push_back(LayerType::full_attention);
      else return make_error(r.where("layer_types") + "[" + std::to_string(i) + "] = " + lt[i].dump() +
                             " is neither \"linear_attention\" nor \"full_attention\"");
    }
  } else {
    int interval = 4;
    KILN_TRY(r.get("full_attention_interval", interval, false));
    KILN_TRY(r.range("full_attention_interval", interval, 1, 1024, "1..1024"));
    for (int i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::full_attention : LayerType::linear_attention);
  }

  KILN_TRY(r.get("num_attention_heads", c.num_attention_heads, c.n_full_layers() > 0));
  KILN_TRY(r.get("num_key_value_heads", c.num_key_value_heads, c.n_full_layers() > 0));
  KILN_TRY(r.get("head_dim", c.head_dim, false));
  if (c.n_full_layers() > 0) {
    KILN_TRY(r.range("num_attention_heads", c.num_attention_heads, 1, 4096, "1..4096"));
    KILN_TRY(r.range("num_key_value_heads", c.num_key_value_heads, 1, c.num_attention_heads,
                     "1..num_attention_heads"));
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      return make_error(r.where("num_key_value_heads") + " = " + std::to_string(c.num_key_value_heads) +
                        " does not divide num_attention_heads = " + std::to_string(c.num_attention_heads));
    KILN_TRY(r.range("head_dim", c.head_dim, 2, 4096, "2..4096"));
  }

  // RoPE: rope_parameters (new form) or top-level rope_theta / partial_rotary_factor (old form).
  const json* rp = nullptr;
  std::string rp_name;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!s.contains(key) || s[key].is_null()) continue;
    KILN_TRY(check_rope_kind(s[key], r.where(key)));
    if (!rp) rp = &s[key], rp_name = std::string(key) + ".";
  }
  auto read_num = [&](const char* key, double& out) -> Status {
    if (rp && rp->contains(key) && !(*rp)[key].is_null())
      return Reader::read(*rp, r.where((rp_name + key).c_str()), key, out, false);
    return r.get(key, out, false);
  };
  KILN_TRY(read_num("rope_theta", c.rope_theta));
  KILN_TRY(read_num("partial_rotary_factor", c.partial_rotary_factor));
  KILN_TRY(r.range("rope_theta", c.rope_theta, 1, 1e12, "1..1e12"));
  KILN_TRY(r.range("partial_rotary_factor", c.partial_rotary_factor, 0, 1, "0..1"));
  c.rotary_dim = int(std::lround(c.head_dim * c.partial_rotary_factor));
  c.rotary_dim -= c.rotary_dim % 2;

  if (c.n_linear_layers() > 0) {
    KILN_TRY(r.get("linear_num_key_heads", c.linear_num_key_heads, true));
    KILN_TRY(r.get("linear_num_value_heads", c.linear_num_value_heads, true));
    KILN_TRY(r.get("linear_key_head_dim", c.linear_key_head_dim, true));
    KILN_TRY(r.get("linear_value_head_dim", c.linear_value_head_dim, true));
    KILN_TRY(r.get("linear_conv_kernel_dim", c.linear_conv_kernel_dim, false));
    KILN_TRY(r.range("linear_num_key_heads", c.linear_num_key_heads, 1, 4096, "1..4096"));
    KILN_TRY(r.range("linear_num_value_heads", c.linear_num_value_heads, 1, 4096, "1..4096"));
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
      return make_error(r.where("linear_num_value_heads") + " = " + std::to_string(c.linear_num_value_heads) +
                        " is not a multiple of linear_num_key_heads = " + std::to_string(c.linear_num_key_heads));
    KILN_TRY(r.range("linear_key_head_dim", c.linear_key_head_dim, 1, 4096, "1..4096"));
    KILN_TRY(r.range("linear_value_head_dim", c.linear_value_head_dim, 1, 4096, "1..4096"));
    KILN_TRY(r.range("linear_conv_kernel_dim", c.linear_conv_kernel_dim, 1, 64, "1..64"));
  }

  if (c.is_moe) {
    KILN_TRY(r.get("num_experts", c.num_experts, true));
    KILN_TRY(r.range("num_experts", c.num_experts, 1, 65536, "1..65536"));
    KILN_TRY(r.get("num_experts_per_tok", c.num_experts_per_tok, true));
    KILN_TRY(r.range("num_experts_per_tok", c.num_experts_per_tok, 1, c.num_experts, "1..num_experts"));
    // Absent sizes are read from the tensors when the weights are bound (0 / −1 mark "absent").
    KILN_TRY(r.get("moe_intermediate_size", c.moe_intermediate_size, false));
    KILN_TRY(r.range("moe_intermediate_size", double(c.moe_intermediate_size), 0, 1 << 20, "1..2^20"));
    c.shared_expert_intermediate_size = -1;
    KILN_TRY(r.get("shared_expert_intermediate_size", c.shared_expert_intermediate_size, false));
    KILN_TRY(r.range("shared_expert_intermediate_size", double(c.shared_expert_intermediate_size), -1, 1 << 20,
                     "0..2^20"));
    bool norm_topk = true;
    KILN_TRY(r.get("norm_topk_prob", norm_topk, false));
    if (!norm_topk) return make_error(r.where("norm_topk_prob") + " = false is not supported (Qwen3.5/3.6 renormalise)");
  } else {
    KILN_TRY(r.get("intermediate_size", c.intermediate_size, true));
    KILN_TRY(r.range("intermediate_size", double(c.intermediate_size), 1, 1 << 20, "1..2^20"));
  }
  return c;
}

Status merge_generation_config(ModelConfig& c, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(path + ": not a JSON object");
  std::vector<int64_t> ids;
  KILN_TRY(parse_token_ids(j, "eos_token_id", path + ": eos_token_id", ids));
  for (int64_t id : ids)
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
  return {};
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace kiln::engine
