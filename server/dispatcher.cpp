#include "server/dispatcher.h"

#include <filesystem>
#include <map>
#include <ostream>

#include <nlohmann/json.hpp>

#include "agent/engine_provider.h"
#include "agent/worker_pool.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/models.h"

namespace kiln::server {

struct Dispatcher::Impl {
  // Declaration order is destruction order reversed: the pool (last) goes first.
  std::vector<std::unique_ptr<engine::Model>> models;
  std::vector<std::unique_ptr<engine::Tokenizer>> tokenizers;
  std::unique_ptr<agent::WorkerPool> pool;
};

Dispatcher::Dispatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dispatcher::~Dispatcher() { stop(); }

void Dispatcher::stop() {
  if (impl_->pool) impl_->pool->stop();
}

std::unique_ptr<Dispatcher> Dispatcher::start(const ServerConfig& config, store::Store& store,
                                              ModelRegistry& registry, std::ostream& log) {
  auto impl = std::make_unique<Impl>();
  std::map<std::string, agent::EngineModelEntry> entries;
  int slots = 0;
  for (const ModelConfig& m : config.models) {
    engine::EngineOptions options;
    options.threads = m.threads;
    options.kv_budget_bytes = static_cast<int64_t>(m.kv_budget_bytes);
    options.max_sessions = m.max_sessions;
    auto model = engine::Model::load(m.path, options);
    if (!model.ok()) {
      log << "level=error msg=\"model failed to load; its builds will end with model_error\" model=" << m.name
          << " error=\"" << model.error() << "\"" << std::endl;
      registry.set_engine_state(m.name, false, nullptr);
      continue;
    }
    auto tokenizer = engine::Tokenizer::load_model_dir(m.path);
    if (!tokenizer.ok()) {
      log << "level=error msg=\"tokenizer failed to load\" model=" << m.name << " error=\"" << tokenizer.error << "\""
          << std::endl;
      registry.set_engine_state(m.name, false, nullptr);
      continue;
    }
    const engine::CapacityPlan& plan = model.value()->plan();
    log << "level=info msg=\"model loaded\" model=" << m.name << " kv_tokens=" << plan.kv_tokens
        << " max_sessions=" << plan.max_sessions << " full_length_sessions=" << plan.full_length_sessions
        << (m.demo ? " warning=\"RANDOM WEIGHTS (demo)\"" : "") << std::endl;
    registry.set_engine_state(m.name, true,
                              {{"budget_bytes", plan.budget_bytes},
                               {"max_sessions", plan.max_sessions},
                               {"kv_bytes_per_token", plan.kv_bytes_per_token},
                               {"state_bytes_per_session", plan.state_bytes_per_session},
                               {"kv_tokens", plan.kv_tokens},
                               {"max_position_embeddings", plan.max_position_embeddings},
                               {"full_length_sessions", plan.full_length_sessions}});
    agent::EngineChatModelOptions chat;
    chat.sampling.temperature = static_cast<float>(m.sampling.temperature);
    chat.sampling.top_p = static_cast<float>(m.sampling.top_p);
    chat.sampling.top_k = m.sampling.top_k;
    chat.sampling.seed = m.sampling.seed;
    entries[m.name] = {model.value().get(), tokenizer.tokenizer.get(), chat};
    slots += plan.max_sessions;
    impl->models.push_back(std::move(model.value()));
    impl->tokenizers.push_back(std::move(tokenizer.tokenizer));
  }
  agent::WorkerOptions options;
  options.workspace_root = std::filesystem::path(config.var_dir) / "workspaces";
  int workers = config.workers > 0 ? config.workers : std::max(1, slots);
  impl->pool = std::make_unique<agent::WorkerPool>(options, store, agent::engine_model_provider(std::move(entries)),
                                                   workers);
  impl->pool->start();
  log << "level=info msg=\"workers started\" workers=" << workers << std::endl;
  return std::unique_ptr<Dispatcher>(new Dispatcher(std::move(impl)));
}

}  // namespace kiln::server
