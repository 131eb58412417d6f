// The models kiln serve is configured with, as /v1/models shows them: name, path, architecture
// (read from the model directory's config.json), whether the engine has it loaded, its capacity
// plan, and live stats from the store (builds running on it, decode tokens/s).
// Thread-safe: describe() may run on any io thread; load state is guarded by mu_.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/config.h"

namespace kiln::store {
class Store;
}

namespace kiln::server {

// The architecture summary of an HF model directory (its config.json, text_config if nested).
// Returns an error naming the file when it is missing or malformed.
std::optional<std::string> read_architecture(const std::string& model_dir, nlohmann::json& out);

class ModelRegistry {
 public:
  explicit ModelRegistry(std::vector<ModelConfig> models);

  const std::vector<ModelConfig>& models() const { return models_; }
  // Records what the engine reported for a model (loaded or not, its capacity plan as JSON).
  void set_engine_state(const std::string& name, bool loaded, nlohmann::json plan);
  // The model host's view (state loaded/loading/unloaded, in_use, estimated_bytes, loads, ...),
  // shown as "residency" in /v1/models.
  void set_host_state(const std::string& name, nlohmann::json state);
  // While a model is loaded: reads its engine's KV memory counters now (pages, pages_in_use,
  // page_tokens, reclaims, preemptions, waits, refusals). Cleared (empty function) before the model is freed.
  void set_kv_reader(const std::string& name, std::function<nlohmann::json()> reader);
  // Each loaded model's KV counters (see set_kv_reader), by name.
  std::map<std::string, nlohmann::json> kv_stats() const;
  // The /v1/models document. `store` may be null (no live stats then).
  nlohmann::json describe(store::Store* store) const;

 private:
  struct EngineState {
    bool loaded = false;
    nlohmann::json plan;  // null until the engine planned it
    nlohmann::json host;  // null for models the host does not manage
    std::function<nlohmann::json()> kv;  // set while loaded
  };
  std::vector<ModelConfig> models_;
  mutable std::mutex mu_;
  std::map<std::string, EngineState> engine_;  // guarded by mu_
};

}  // namespace kiln::server
