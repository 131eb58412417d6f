#include "engine/engine.h"

#include <algorithm>
#include <filesystem>

namespace kiln::engine {

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const EngineOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->options_ = options;
  auto config = load_model_config((std::filesystem::path(dir) / "config.json").string());
  if (!config) return make_error(config.error());
  m->config_ = std::move(config).value();
  auto ck = Checkpoint::open_dir(dir);
  if (!ck) return make_error(ck.error());
  m->checkpoint_ = std::move(ck).value();
  auto w = bind_weights(m->config_, *m->checkpoint_, dir);
  if (!w) return make_error(w.error());
  m->weights_ = std::move(w).value();
  if (options.max_sessions < 1) return make_error("engine options: max_sessions must be at least 1");
  m->plan_ = plan_capacity(m->config_, options.kv_budget_bytes, options.max_sessions, options.cache_dtype,
                           options.page_tokens);
  if (m->config_.n_full_layers() > 0 && m->plan_.pages < 1)
    return make_error("KV budget of " + std::to_string(options.kv_budget_bytes) + " bytes leaves no KV page after " +
                      std::to_string(options.max_sessions) + " sessions' fixed state of " +
                      std::to_string(m->plan_.state_bytes_per_session) + " bytes each");
  m->pool_ = std::make_unique<ThreadPool>(options.threads);
  if (options.weights) {
    WeightLoadOptions wo{*options.weights, options.quantize_lm_head, options.weight_cache, options.progress};
    auto stored = StoredWeights::apply(m->weights_, *m->checkpoint_, dir, wo, m->pool_.get());
    if (!stored) return make_error(stored.error());
    m->stored_ = std::move(stored).value();
  }
  KvLayout layout{m->config_.n_full_layers(), m->config_.kv_dim(), options.cache_dtype, options.page_tokens};
  m->kv_pool_ = std::make_unique<KvPool>(layout, std::max<int64_t>(m->plan_.pages, 1));
  m->network_ = std::make_unique<Qwen35Model>(m->config_, m->weights_, m->pool_.get());
  return m;
}

Model::~Model() = default;

Result<std::unique_ptr<Session>> Model::open_session() {
  int n = open_sessions_.fetch_add(1);
  if (n >= options_.max_sessions) {
    open_sessions_.fetch_sub(1);
    return make_error("session limit reached: " + std::to_string(options_.max_sessions) + " sessions are open");
  }
  return std::unique_ptr<Session>(new Session(*this));
}

Session::Session(Model& model) : model_(model) {
  state_.dtype = model.options_.cache_dtype;
  state_.kv = std::make_unique<SequenceKv>(*model.kv_pool_);
  model.network_->init_state(state_);
}

Session::~Session() {
  state_.kv.reset();  // pages back to the pool
  model_.open_sessions_.fetch_sub(1);
}

Result<std::vector<float>> Session::append(std::span<const int32_t> tokens, bool all_logits) {
  const ModelConfig& c = model_.config_;
  if (tokens.empty()) return make_error("append: no tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return make_error("append: token " + std::to_string(i) + " = " + std::to_string(tokens[i]) +
                        " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  const int64_t T = int64_t(tokens.size()), n = size() + T;
  if (n > c.max_position_embeddings)
    return make_error("append: context of " + std::to_string(n) + " tokens exceeds max_position_embeddings = " +
                      std::to_string(c.max_position_embeddings));
  if (c.n_full_layers() > 0) {
    Status s = state_.kv->reserve(n);
    if (!s) return make_error(s.error());
  }
  const int64_t V = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>((all_logits ? T : 1) * V));
  model_.network_->forward(tokens.data(), T, state_, all_logits, logits.data());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  last_logits_.assign(logits.end() - V, logits.end());
  return logits;
}

Result<GenerateResult> Session::generate(const GenerateOptions& o, const std::function<bool(int32_t)>& on_token) {
  if (last_logits_.empty()) return make_error("generate: the session is empty; append a prompt first");
  Sampler sampler(o.sampling);
  GenerateResult r;
  while (int64_t(r.tokens.size()) < o.max_tokens) {
    const int32_t tok = sampler.sample(last_logits_, r.tokens);
    auto step = append(std::span<const int32_t>(&tok, 1));
    if (!step) return make_error(step.error());
    r.tokens.push_back(tok);
    if (on_token && !on_token(tok)) {
      r.reason = GenerateResult::Reason::callback;
      return r;
    }
    if (std::find(o.stop.begin(), o.stop.end(), tok) != o.stop.end()) {
      r.reason = GenerateResult::Reason::stop_token;
      return r;
    }
  }
  r.reason = GenerateResult::Reason::max_tokens;
  return r;
}

SessionCheckpoint Session::checkpoint() const { return SessionCheckpoint{tokens_, state_.gdn, last_logits_}; }

Status Session::rewind(const SessionCheckpoint& cp) {
  if (cp.tokens.size() > tokens_.size() || !std::equal(cp.tokens.begin(), cp.tokens.end(), tokens_.begin()))
    return make_error("rewind: the checkpoint's " + std::to_string(cp.tokens.size()) +
                      " tokens are not a prefix of this session's history");
  if (cp.gdn.size() != state_.gdn.size()) return make_error("rewind: the checkpoint belongs to another model");
  tokens_ = cp.tokens;
  state_.gdn = cp.gdn;
  state_.n_past = int64_t(tokens_.size());
  state_.kv->truncate(state_.n_past);
  last_logits_ = cp.last_logits;
  return {};
}

}  // namespace kiln::engine
