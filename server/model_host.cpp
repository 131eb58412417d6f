#include "server/model_host.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <ostream>

#include "agent/engine_provider.h"
#include "engine/capacity.h"
#include "engine/cpu/quant.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/models.h"

namespace kiln::server {

namespace fs = std::filesystem;

uint64_t checkpoint_bytes(const std::string& model_dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") total += it->file_size(ec);
  }
  return total;
}

// Resident weight bytes after conversion, from the checkpoint's size (bf16 on disk for the released
// models): q8 keeps 34 bytes per 32 weights, q4 20 (scale + offset), bf16 64. An estimate: the
// embedding stays exact and f32 checkpoints are twice the size, so this errs on the large side.
static uint64_t weight_bytes_estimate(uint64_t checkpoint_bytes, const std::string& weights) {
  if (weights == "q8") return checkpoint_bytes / 64 * 34;
  if (weights == "q4") return checkpoint_bytes / 64 * 20;
  return checkpoint_bytes;
}

uint64_t model_memory_estimate(const ModelConfig& m) {
  return weight_bytes_estimate(checkpoint_bytes(m.path), m.weights) + m.kv_budget_bytes;
}

void resolve_kv_budgets(ServerConfig& config, int64_t usable_memory, std::ostream& log) {
  constexpr int64_t kFallback = int64_t(1) << 30;  // a model whose config cannot be read fails to load anyway
  for (ModelConfig& m : config.models) {
    if (!m.scripted_test_turns.empty()) continue;
    auto mc = engine::load_model_config((fs::path(m.path) / "config.json").string());
    const auto dtype = engine::parse_cache_dtype(m.cache_dtype).value_or(engine::CacheDtype::f32);
    if (m.kv_budget_bytes == 0) {
      int64_t budget = kFallback;
      if (mc) {
        const int64_t tokens = std::min<int64_t>(mc->max_position_embeddings, kAutoKvTokensPerSession);
        budget = engine::kv_budget_for(*mc, m.max_sessions, dtype, tokens, 16, m.draft_tokens);
        const auto weights = int64_t(weight_bytes_estimate(checkpoint_bytes(m.path), m.weights));
        int64_t cap = std::numeric_limits<int64_t>::max();
        if (usable_memory > 0) cap = std::max<int64_t>(usable_memory - weights, 0) / 2;
        if (config.memory_budget_bytes > 0)
          cap = std::min(cap, std::max<int64_t>(int64_t(std::min<uint64_t>(config.memory_budget_bytes, INT64_MAX)) - weights, 0));
        // Below this not even a short build fits; such a model is not meant for this machine.
        cap = std::max(cap, engine::kv_budget_for(*mc, m.max_sessions, dtype, 4096, 16, m.draft_tokens));
        budget = std::min(budget, cap);
      }
      m.kv_budget_bytes = uint64_t(budget);
    }
    if (!mc) continue;
    const engine::CapacityPlan plan =
        engine::plan_capacity(*mc, int64_t(m.kv_budget_bytes), m.max_sessions, dtype, 16, m.draft_tokens);
    const int64_t per_session = mc->n_full_layers() > 0 ? plan.kv_tokens / std::max(1, m.max_sessions)
                                                        : mc->max_position_embeddings;
    log << "level=info msg=\"kv budget\" model=" << m.name << " kv_budget_bytes=" << m.kv_budget_bytes
        << " max_sessions=" << m.max_sessions << " cache_dtype=" << engine::cache_dtype_name(dtype)
        << " tokens_per_session=" << per_session << std::endl;
    if (per_session < std::min<int64_t>(kAgentContextTokens, mc->max_position_embeddings))
      log << "level=warn msg=\"KV budget is small for agent builds: raise kv_budget, lower max_sessions or use "
             "cache_dtype bf16\" model="
          << m.name << " kv_tokens=" << plan.kv_tokens << " max_sessions=" << m.max_sessions
          << " tokens_per_session=" << per_session << std::endl;
  }
}

// One loaded engine model and what opens chat models on it.
struct ModelHost::Loaded {
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Tokenizer> tokenizer;
  agent::ModelProvider provider;
};

struct ModelHost::Slot {
  ModelConfig config;
  uint64_t estimated_bytes = 0;
  std::shared_ptr<Loaded> loaded;  // null when unloaded
  bool loading = false;
  int in_use = 0;
  Clock::time_point last_used{};
  std::string load_error;
  int64_t loads = 0, unloads = 0;
};

// A build's chat model; the model stays loaded while it lives. Its engine session (inner_) is
// closed before the host is told, so an unload never pulls the model from under a session.
class ModelHost::Lease final : public agent::ChatModel {
 public:
  Lease(ModelHost& host, std::string name, std::shared_ptr<Loaded> loaded, std::unique_ptr<agent::ChatModel> inner)
      : host_(host), name_(std::move(name)), loaded_(std::move(loaded)), inner_(std::move(inner)) {}
  ~Lease() override {
    inner_.reset();
    loaded_.reset();
    host_.release(name_);
  }
  std::string name() const override { return inner_->name(); }
  int64_t context_limit() const override { return inner_->context_limit(); }
  agent::Result<int64_t> prompt_tokens(const std::vector<agent::Message>& conversation,
                                       const std::vector<agent::ToolSchema>& tools) override {
    return inner_->prompt_tokens(conversation, tools);
  }
  agent::ModelTurn next_turn(const agent::TurnRequest& request, const agent::DeltaSink& on_delta,
                             const std::atomic<bool>& cancel) override {
    return inner_->next_turn(request, on_delta, cancel);
  }

 private:
  ModelHost& host_;
  std::string name_;
  std::shared_ptr<Loaded> loaded_;
  std::unique_ptr<agent::ChatModel> inner_;
};

ModelHost::ModelHost(std::vector<ModelConfig> models, uint64_t memory_budget_bytes, ModelRegistry* registry,
                     std::ostream& log, store::Store* store)
    : budget_(memory_budget_bytes), registry_(registry), store_(store), log_(log) {
  for (ModelConfig& m : models) {
    auto slot = std::make_unique<Slot>();
    slot->estimated_bytes = model_memory_estimate(m);
    slot->config = std::move(m);
    publish_locked(*slot);
    slots_[slot->config.name] = std::move(slot);
  }
}

ModelHost::~ModelHost() {
  if (registry_ == nullptr) return;
  for (const auto& [name, slot] : slots_) registry_->set_kv_reader(name, {});  // before the models go
}

bool ModelHost::hosts(const std::string& name) const { return slots_.count(name) > 0; }

void ModelHost::publish_locked(const Slot& s) {
  if (registry_ == nullptr) return;
  nlohmann::json plan = nullptr;
  if (s.loaded) {
    const engine::CapacityPlan& p = s.loaded->model->plan();
    plan = {{"budget_bytes", p.budget_bytes},
            {"max_sessions", p.max_sessions},
            {"kv_bytes_per_token", p.kv_bytes_per_token},
            {"state_bytes_per_session", p.state_bytes_per_session},
            {"kv_tokens", p.kv_tokens},
            {"max_position_embeddings", p.max_position_embeddings},
            {"full_length_sessions", p.full_length_sessions}};
  }
  registry_->set_engine_state(s.config.name, s.loaded != nullptr, std::move(plan));
  std::function<nlohmann::json()> kv;
  if (s.loaded) {
    kv = [model = s.loaded->model.get()] {
      const engine::KvPool& pool = model->kv_pool();
      return nlohmann::json{{"pages", pool.max_pages()},
                            {"pages_in_use", pool.pages_in_use()},
                            {"page_tokens", pool.layout().page_tokens},
                            {"reclaims", model->kv_reclaims()},
                            {"preemptions", model->kv_preemptions()},
                            {"waits", model->kv_waits()},
                            {"refusals", model->kv_refusals()}};
    };
  }
  registry_->set_kv_reader(s.config.name, std::move(kv));
  registry_->set_host_state(s.config.name, {{"state", s.loaded ? "loaded" : s.loading ? "loading" : "unloaded"},
                                            {"in_use", s.in_use},
                                            {"estimated_bytes", s.estimated_bytes},
                                            {"idle_unload_seconds", s.config.idle_unload_seconds},
                                            {"loads", s.loads},
                                            {"unloads", s.unloads},
                                            {"load_error", s.load_error.empty() ? nlohmann::json(nullptr)
                                                                                : nlohmann::json(s.load_error)}});
}

void ModelHost::unload_locked(Slot& s, const char* why, Deferred& later) {
  later.freed.push_back(std::move(s.loaded));
  ++s.unloads;
  later.log += "level=info msg=\"model unloaded\" model=" + s.config.name + " reason=" + why +
               " estimated_bytes=" + std::to_string(s.estimated_bytes) + "\n";
  publish_locked(s);
}

void ModelHost::flush(Deferred& later) {
  later.freed.clear();
  if (!later.log.empty()) log_ << later.log << std::flush;
  later.log.clear();
}

agent::Result<std::unique_ptr<agent::ChatModel>> ModelHost::open(const std::string& name, int64_t build_id) {
  auto it = slots_.find(name);
  if (it == slots_.end()) return agent::Error{"no model named '" + name + "' is configured"};
  Slot& s = *it->second;
  Deferred later;  // declared before the lock, so what it still holds is freed after the unlock
  std::unique_lock lock(mu_);
  loaded_cv_.wait(lock, [&] { return !s.loading; });
  if (!s.loaded) {
    // Make room: idle models, least recently used first.
    uint64_t in_memory = 0;
    for (auto& [n, other] : slots_) in_memory += other->loaded || other->loading ? other->estimated_bytes : 0;
    while (budget_ > 0 && in_memory + s.estimated_bytes > budget_) {
      Slot* victim = nullptr;
      for (auto& [n, other] : slots_) {
        if (other->loaded && other->in_use == 0 && (!victim || other->last_used < victim->last_used)) victim = other.get();
      }
      if (victim == nullptr) {
        std::string busy;
        for (auto& [n, other] : slots_) busy += other->loaded || other->loading ? (busy.empty() ? "" : ", ") + n : "";
        lock.unlock();
        flush(later);
        return agent::Error{"loading model '" + name + "' (about " + std::to_string(s.estimated_bytes >> 20) +
                            " MiB) would exceed memory_budget (" + std::to_string(budget_ >> 20) +
                            " MiB) while models in use hold the rest: " + busy};
      }
      in_memory -= victim->estimated_bytes;
      unload_locked(*victim, "memory_budget", later);
    }
    s.loading = true;
    publish_locked(s);
    lock.unlock();
    flush(later);  // frees the evicted models' memory before the new one is loaded

    log_ << "level=info msg=\"loading model (first use)\" model=" << name << " path=" << s.config.path << std::endl;
    engine::EngineOptions options;
    options.threads = s.config.threads;
    options.kv_budget_bytes = static_cast<int64_t>(s.config.kv_budget_bytes);
    options.max_sessions = s.config.max_sessions;
    options.max_draft_tokens = s.config.draft_tokens;
    options.weights = engine::cpu::parse_weight_choice(s.config.weights).value_or(std::nullopt);  // validated
    options.cache_dtype = engine::parse_cache_dtype(s.config.cache_dtype).value_or(engine::CacheDtype::f32);  // validated
    std::shared_ptr<Loaded> loaded;
    std::string error;
    // Loading reads outside input (the tokenizer's JSON among it): an exception must end as this
    // model's load error, or s.loading would stay set and every later open() would wait forever.
    try {
      loaded = std::make_shared<Loaded>();
      auto model = engine::Model::load(s.config.path, options);
      if (!model.ok()) {
        error = "model failed to load: " + model.error();
      } else {
        auto tokenizer = engine::Tokenizer::load_model_dir(s.config.path);
        if (!tokenizer.ok()) {
          error = "tokenizer failed to load: " + tokenizer.error;
        } else {
          loaded->model = std::move(model.value());
          loaded->tokenizer = std::move(tokenizer.tokenizer);
          agent::EngineChatModelOptions chat;
          chat.sampling.temperature = static_cast<float>(s.config.sampling.temperature);
          chat.sampling.top_p = static_cast<float>(s.config.sampling.top_p);
          chat.sampling.top_k = s.config.sampling.top_k;
          chat.sampling.seed = s.config.sampling.seed;
          chat.speculative.draft_tokens = s.config.draft_tokens;
          // A session can never hold more than the whole KV pool: compact before reaching it
          // rather than fail the turn with "context memory exhausted".
          if (loaded->model->config().n_full_layers() > 0) chat.context_limit = loaded->model->plan().kv_tokens;
          loaded->provider =
              agent::engine_model_provider({{name, {loaded->model.get(), loaded->tokenizer.get(), chat}}}, store_);
        }
      }
    } catch (const std::exception& e) {
      error = std::string("model failed to load: ") + e.what();
    } catch (...) {
      error = "model failed to load: unknown exception";
    }

    lock.lock();
    s.loading = false;
    loaded_cv_.notify_all();
    if (!error.empty()) {
      s.load_error = error;
      publish_locked(s);
      lock.unlock();
      log_ << "level=error msg=\"model failed to load; its builds end with model_error\" model=" << name
           << " error=\"" << error << "\"" << std::endl;
      return agent::Error{error};
    }
    s.loaded = std::move(loaded);
    s.load_error.clear();
    ++s.loads;
    const engine::CapacityPlan& plan = s.loaded->model->plan();
    later.log += "level=info msg=\"model loaded\" model=" + name + " kv_tokens=" + std::to_string(plan.kv_tokens) +
                 " max_sessions=" + std::to_string(plan.max_sessions) +
                 " full_length_sessions=" + std::to_string(plan.full_length_sessions) +
                 " estimated_bytes=" + std::to_string(s.estimated_bytes) +
                 (s.config.demo ? " warning=\"RANDOM WEIGHTS (demo)\"" : "") + "\n";
  }
  std::shared_ptr<Loaded> loaded = s.loaded;
  ++s.in_use;
  s.last_used = Clock::now();
  publish_locked(s);
  lock.unlock();
  flush(later);

  // Opens an engine session, outside the lock: it may wait in the engine's line for a free slot.
  auto opened = loaded->provider(name, build_id);
  if (!opened.ok()) {
    release(name);
    return agent::Error{opened.error()};
  }
  return std::unique_ptr<agent::ChatModel>(
      std::make_unique<Lease>(*this, name, std::move(loaded), std::move(opened).value()));
}

void ModelHost::release(const std::string& name) {
  std::lock_guard lock(mu_);
  Slot& s = *slots_.at(name);
  --s.in_use;
  s.last_used = Clock::now();
  publish_locked(s);
}

int ModelHost::sweep(Clock::time_point now) {
  Deferred later;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, s] : slots_) {
      int idle_s = s->config.idle_unload_seconds;
      if (s->loaded && s->in_use == 0 && idle_s > 0 && now - s->last_used >= std::chrono::seconds(idle_s)) {
        unload_locked(*s, "idle", later);
      }
    }
  }
  int unloaded = static_cast<int>(later.freed.size());
  flush(later);
  return unloaded;
}

ModelHost::ModelState ModelHost::state(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(name);
  if (it == slots_.end()) return {};
  const Slot& s = *it->second;
  return {s.loaded != nullptr, s.in_use, s.estimated_bytes, s.load_error, s.loads, s.unloads};
}

uint64_t ModelHost::loaded_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t total = 0;
  for (auto& [n, s] : slots_) total += s->loaded ? s->estimated_bytes : 0;
  return total;
}

}  // namespace kiln::server
