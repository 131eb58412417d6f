#include "server/models.h"

#include <fstream>
#include <sstream>

#include "store/store.h"

namespace kiln::server {

using nlohmann::json;

std::optional<std::string> read_architecture(const std::string& model_dir, json& out) {
  std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return "cannot read " + path;
  std::stringstream ss;
  ss << in.rdbuf();
  json doc = json::parse(ss.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return path + ": not a JSON object";
  const json& text = doc.contains("text_config") && doc["text_config"].is_object() ? doc["text_config"] : doc;
  out = json::object();
  if (doc.contains("architectures")) out["architectures"] = doc["architectures"];
  for (const char* key : {"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                          "num_key_value_heads", "num_experts", "num_experts_per_tok", "vocab_size",
                          "max_position_embeddings", "full_attention_interval"}) {
    if (text.contains(key)) out[key] = text[key];
  }
  if (text.contains("layer_types") && text["layer_types"].is_array()) {
    int full = 0, linear = 0;
    for (const json& t : text["layer_types"]) (t == "full_attention" ? full : linear) += 1;
    out["full_attention_layers"] = full;
    out["linear_attention_layers"] = linear;
  }
  return std::nullopt;
}

ModelRegistry::ModelRegistry(std::vector<ModelConfig> models) : models_(std::move(models)) {}

void ModelRegistry::set_engine_state(const std::string& name, bool loaded, json plan) {
  std::lock_guard lock(mu_);
  EngineState& e = engine_[name];
  e.loaded = loaded;
  e.plan = std::move(plan);
}

void ModelRegistry::set_kv_reader(const std::string& name, std::function<json()> reader) {
  std::lock_guard lock(mu_);
  engine_[name].kv = std::move(reader);
}

std::map<std::string, json> ModelRegistry::kv_stats() const {
  std::lock_guard lock(mu_);  // held while reading: the host clears a reader under it before freeing
  std::map<std::string, json> out;
  for (const auto& [name, e] : engine_)
    if (e.kv) out[name] = e.kv();
  return out;
}

void ModelRegistry::set_host_state(const std::string& name, json state) {
  std::lock_guard lock(mu_);
  engine_[name].host = std::move(state);
}

json ModelRegistry::describe(store::Store* store) const {
  // Live stats: running builds per model from the queue, decode speed from finished builds.
  std::map<std::string, int64_t> running;
  std::map<std::string, double> decode_tps;
  if (store != nullptr) {
    store::ListQuery q;
    q.status = store::BuildStatus::running;
    q.limit = 1000;
    if (auto page = store->list(q)) {
      for (const store::Build& b : page->builds) ++running[b.spec.model];
    }
    store::CompareQuery cq;
    for (const ModelConfig& m : models_) cq.models.push_back(m.name);
    if (auto report = store->compare(cq)) {
      for (const store::ModelStats& s : report->models)
        if (s.decode_tokens_per_s) decode_tps[s.model] = *s.decode_tokens_per_s;
    }
  }
  json list = json::array();
  std::lock_guard lock(mu_);
  for (const ModelConfig& m : models_) {
    json arch;
    json entry = {{"name", m.name},
                  {"path", m.path},
                  {"threads", m.threads},
                  {"kv_budget_bytes", m.kv_budget_bytes},
                  {"max_sessions", m.max_sessions},
                  {"weights", m.weights},
                  {"cache_dtype", m.cache_dtype},
                  {"sampling", {{"temperature", m.sampling.temperature},
                                {"top_p", m.sampling.top_p},
                                {"top_k", m.sampling.top_k}}}};
    entry["kind"] = m.scripted_test_turns.empty() ? "engine" : "scripted_test";
    if (!m.scripted_test_turns.empty()) {
      entry["architecture"] = nullptr;
      entry["warning"] = "SCRIPTED TEST MODEL: replays a fixed list of turns from the config; not a language model";
    } else if (auto err = read_architecture(m.path, arch)) {
      entry["architecture"] = nullptr;
      entry["architecture_error"] = *err;
    } else {
      entry["architecture"] = arch;
    }
    auto it = engine_.find(m.name);
    entry["loaded"] = it != engine_.end() && it->second.loaded;
    entry["capacity_plan"] = it != engine_.end() ? it->second.plan : json(nullptr);
    entry["residency"] = it != engine_.end() ? it->second.host : json(nullptr);
    entry["kv"] = it != engine_.end() && it->second.kv ? it->second.kv() : json(nullptr);
    entry["idle_unload_seconds"] = m.idle_unload_seconds;
    entry["stats"] = {{"sessions_in_use", running[m.name]}, {"max_sessions", m.max_sessions},
                      {"decode_tokens_per_s", decode_tps.count(m.name) ? json(decode_tps[m.name]) : json(nullptr)}};
    if (m.demo) {
      entry["demo"] = true;
      entry["warning"] = "demo model with RANDOM weights: builds run end to end but its output is noise";
    }
    list.push_back(std::move(entry));
  }
  return {{"models", list}};
}

}  // namespace kiln::server
