#include "server/dispatcher.h"

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <ostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/engine_provider.h"
#include "agent/scripted_chat_model.h"
#include "agent/worker_pool.h"
#include "server/model_host.h"
#include "server/models.h"

namespace kiln::server {

namespace {

// The turns of a scripted test model (config.cpp has checked their shape).
std::vector<agent::ScriptedTurn> scripted_turns(const std::string& turns_json) {
  std::vector<agent::ScriptedTurn> turns;
  for (const nlohmann::json& t : nlohmann::json::parse(turns_json)) {
    agent::ScriptedTurn turn;
    turn.reasoning = t.value("reasoning", "");
    turn.text = t.value("text", "");
    turn.decode_ms_per_token = t.value("decode_ms_per_token", 0);
    for (const nlohmann::json& c : t.value("calls", nlohmann::json::array())) {
      agent::ToolCall call;
      call.name = c["name"].get<std::string>();
      call.arguments = agent::Json::parse(c.value("arguments", nlohmann::json::object()).dump());
      turn.calls.push_back(std::move(call));
    }
    turns.push_back(std::move(turn));
  }
  return turns;
}

}  // namespace

struct Dispatcher::Impl {
  // Declaration order is destruction order reversed: the sweeper and the pool go first, the
  // host (and the models it holds) outlives every build.
  std::unique_ptr<ModelHost> host;
  std::unique_ptr<agent::WorkerPool> pool;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu
  std::thread sweeper;    // unloads idle models once a second
};

Dispatcher::Dispatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dispatcher::~Dispatcher() { stop(); }

void Dispatcher::stop() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  if (impl_->sweeper.joinable()) impl_->sweeper.join();
  if (impl_->pool) impl_->pool->stop();
}

ModelHost* Dispatcher::host() { return impl_->host.get(); }

std::unique_ptr<Dispatcher> Dispatcher::start(const ServerConfig& config, store::Store& store,
                                              ModelRegistry& registry, std::ostream& log) {
  auto impl = std::make_unique<Impl>();
  std::vector<ModelConfig> engine_models;
  std::map<std::string, std::vector<agent::ScriptedTurn>> scripted;
  int slots = 0;
  for (const ModelConfig& m : config.models) {
    slots += m.max_sessions;
    if (m.scripted_test_turns.empty()) {
      engine_models.push_back(m);
      continue;
    }
    scripted[m.name] = scripted_turns(m.scripted_test_turns);
    log << "level=warn msg=\"model is a SCRIPTED TEST MODEL: it replays a fixed list of turns from the config, "
           "it is not a language model\" model=" << m.name << " turns=" << scripted[m.name].size() << std::endl;
    registry.set_engine_state(m.name, true, nullptr);
  }
  if (!engine_models.empty()) {
    log << "level=info msg=\"engine models load on first use\" models=" << engine_models.size()
        << " memory_budget_bytes=" << config.memory_budget_bytes << std::endl;
  }
  impl->host = std::make_unique<ModelHost>(std::move(engine_models), config.memory_budget_bytes, &registry, log, &store);

  agent::WorkerOptions options;
  // Absolute: the sandbox binds the workspace by path and refuses relative ones (var_dir is
  // relative by default).
  std::error_code ec;
  options.workspace_root = std::filesystem::absolute(std::filesystem::path(config.var_dir) / "workspaces", ec);
  options.lease_ms = int64_t{config.lease_seconds} * 1000;
  options.heartbeat_interval = std::min(std::chrono::milliseconds(2000), std::chrono::milliseconds(options.lease_ms / 4));
  int workers = config.workers > 0 ? config.workers : std::max(1, slots);
  ModelHost* host = impl->host.get();
  agent::ModelProvider provider = [host, scripted = std::move(scripted)](
                                      const std::string& model, int64_t build_id) -> agent::Result<std::unique_ptr<agent::ChatModel>> {
    if (auto it = scripted.find(model); it != scripted.end()) {
      return std::unique_ptr<agent::ChatModel>(std::make_unique<agent::ScriptedChatModel>(it->second));
    }
    return host->open(model, build_id);
  };
  impl->pool = std::make_unique<agent::WorkerPool>(options, store, std::move(provider), workers);
  impl->pool->start();
  log << "level=info msg=\"workers started\" workers=" << workers;
  if (!impl->pool->sandbox_unusable().empty()) {
    log << " warning=\"sandbox UNUSABLE, builds will end with infra_error: " << impl->pool->sandbox_unusable() << "\"";
  }
  log << std::endl;
  Impl* raw = impl.get();
  raw->sweeper = std::thread([raw] {
    std::unique_lock lock(raw->mu);
    while (!raw->cv.wait_for(lock, std::chrono::seconds(1), [raw] { return raw->stopping; })) {
      lock.unlock();
      raw->host->sweep();
      lock.lock();
    }
  });
  return std::unique_ptr<Dispatcher>(new Dispatcher(std::move(impl)));
}

}  // namespace kiln::server
