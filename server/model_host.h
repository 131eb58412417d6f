// ModelHost: the engine models of `kiln serve`, loaded on first use and unloaded when idle.
//
//   open(name, build)  loads the model if it is not loaded (first use), then opens one chat model
//                      (one engine session) for the build. The model counts as in use until that
//                      chat model is destroyed.
//   memory budget      before loading, the host adds the model's estimated footprint (its
//                      safetensors files + its kv_budget) to what is loaded; over the budget it
//                      unloads idle models, least recently used first; if in-use models alone
//                      leave no room the build gets a model_error naming the budget.
//   sweep(now)         unloads models idle longer than their idle_unload_seconds (0 = never).
// A model that fails to load is retried at its next use; the error is shown in /v1/models.
// Threading: every method is thread-safe. Loading runs outside the lock (other models stay
// usable); a second build asking for a model being loaded waits for that load.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/worker.h"
#include "server/config.h"

namespace kiln::engine {
class Model;
class Tokenizer;
}  // namespace kiln::engine

namespace kiln::store {
class Store;
}

namespace kiln::server {

class ModelRegistry;

// Bytes a model directory's weights take when loaded as stored: the sum of its *.safetensors.
uint64_t checkpoint_bytes(const std::string& model_dir);
// What a model is expected to hold once loaded: its weights in the configured format plus its KV budget.
uint64_t model_memory_estimate(const ModelConfig& model);

// Agent builds run to tens of thousands of tokens: "auto" gives each of a model's max_sessions
// builds room for kAutoKvTokensPerSession (or the model's whole context if shorter), and a budget
// leaving a build under kAgentContextTokens is warned about (idle builds would keep losing their
// cache to others and re-prefilling).
constexpr int64_t kAutoKvTokensPerSession = 65536;
constexpr int64_t kAgentContextTokens = 32768;

// Replaces every "auto" kv_budget (0) of an engine model in `config` with bytes: room for
// kAutoKvTokensPerSession tokens per session, but at most half of what `usable_memory` (0 =
// unknown: no cap) and the memory_budget leave after the model's weights. Logs each size, and
// warns where a model's budget leaves a session under kAgentContextTokens.
void resolve_kv_budgets(ServerConfig& config, int64_t usable_memory, std::ostream& log);

class ModelHost {
 public:
  using Clock = std::chrono::steady_clock;
  // `models`: the engine models (scripted test models are not the host's). `memory_budget_bytes`
  // 0 = no budget. `registry` (may be null) is told every load and unload for /v1/models.
  // `store` (may be null): a build waiting for a free engine session gets `waiting_for_engine`
  // status events with its place in line (agent/engine_provider.h).
  ModelHost(std::vector<ModelConfig> models, uint64_t memory_budget_bytes, ModelRegistry* registry, std::ostream& log,
            store::Store* store = nullptr);
  ~ModelHost();
  ModelHost(const ModelHost&) = delete;
  ModelHost& operator=(const ModelHost&) = delete;

  bool hosts(const std::string& name) const;
  agent::Result<std::unique_ptr<agent::ChatModel>> open(const std::string& name, int64_t build_id);
  // Unloads models idle since before now - idle_unload_seconds; returns how many.
  int sweep(Clock::time_point now = Clock::now());

  struct ModelState {
    bool loaded = false;
    int in_use = 0;                   // open chat models
    uint64_t estimated_bytes = 0;     // weights + kv budget
    std::string load_error;           // of the last failed load
    int64_t loads = 0, unloads = 0;   // since start
  };
  ModelState state(const std::string& name) const;
  uint64_t loaded_bytes() const;

 private:
  struct Loaded;
  struct Slot;
  class Lease;
  void release(const std::string& name);
  // What a locked section leaves for after the unlock: models to free and lines to log (no
  // destruction of a model and no log write happens under mu_).
  struct Deferred {
    std::vector<std::shared_ptr<Loaded>> freed;
    std::string log;
  };
  void flush(Deferred& later);
  // mu_ held: moves the model into `later`.
  void unload_locked(Slot& slot, const char* why, Deferred& later);
  void publish_locked(const Slot& slot);  // tells the registry (for /v1/models)

  const uint64_t budget_;
  ModelRegistry* registry_;
  store::Store* store_;
  std::ostream& log_;
  mutable std::mutex mu_;
  std::condition_variable loaded_cv_;
  std::map<std::string, std::unique_ptr<Slot>> slots_;  // guarded by mu_ (the map is fixed after construction)
};

}  // namespace kiln::server
