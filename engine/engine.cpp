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
  if (options.prefill_chunk < 1) return make_error("engine options: prefill_chunk must be at least 1");
  m->scheduler_ = std::make_unique<Scheduler>(*m->network_, m->config_, options.prefill_chunk);
  return m;
}

Model::~Model() = default;

int Model::open_sessions() const {
  std::lock_guard<std::mutex> lock(admission_mu_);
  return open_;
}

int Model::waiting_sessions() const {
  std::lock_guard<std::mutex> lock(admission_mu_);
  return int(waiters_.size());
}

int64_t Model::position(const Waiter& w) const {
  int64_t ahead = 0;
  for (const Waiter* o : waiters_)
    ahead += o->priority > w.priority || (o->priority == w.priority && o->arrival < w.arrival);
  return ahead + 1;
}

Result<std::unique_ptr<Session>> Model::open_session(int priority) {
  {
    std::lock_guard<std::mutex> lock(admission_mu_);
    if (open_ >= options_.max_sessions || !waiters_.empty())
      return make_error("session limit reached: " + std::to_string(open_) + " of " +
                        std::to_string(options_.max_sessions) + " sessions are open and " +
                        std::to_string(waiters_.size()) + " are waiting");
    ++open_;
  }
  return std::unique_ptr<Session>(new Session(*this, priority));
}

Result<std::unique_ptr<Session>> Model::open_session_waiting(const OpenOptions& o) {
  std::unique_lock<std::mutex> lock(admission_mu_);
  Waiter w{o.priority, arrivals_++};
  waiters_.push_back(&w);
  admission_cv_.notify_all();  // the ones behind it moved down a place
  auto leave = [&] {
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &w));
    admission_cv_.notify_all();  // the ones behind move up
  };
  int64_t reported = 0;
  for (;;) {
    const int64_t pos = position(w);
    if (open_ < options_.max_sessions && pos == 1) break;
    if ((o.cancel && o.cancel->load()) || (o.cancelled && o.cancelled())) {
      leave();
      return make_error("cancelled while waiting for a session slot (position " + std::to_string(pos) + ")");
    }
    if (pos != reported && o.on_wait) {
      reported = pos;
      lock.unlock();
      o.on_wait(pos);
      lock.lock();
      continue;
    }
    admission_cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
  leave();
  ++open_;
  lock.unlock();
  return std::unique_ptr<Session>(new Session(*this, o.priority));
}

void Model::close_slot() {
  std::lock_guard<std::mutex> lock(admission_mu_);
  --open_;
  admission_cv_.notify_all();
}

Session::Session(Model& model, int priority) : model_(model) {
  seq_.priority = priority;
  seq_.state.dtype = model.options_.cache_dtype;
  seq_.state.kv = std::make_unique<SequenceKv>(*model.kv_pool_);
  model.network_->init_state(seq_.state);
}

Session::~Session() {
  seq_.state.kv.reset();  // pages back to the pool
  model_.close_slot();
}

Result<std::vector<float>> Session::append(std::span<const int32_t> tokens, bool all_logits,
                                          const std::atomic<bool>* cancel) {
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
    Status s = seq_.state.kv->reserve(n);  // before queueing: the step itself cannot fail
    if (!s) return make_error(s.error());
  }
  std::vector<float> logits(static_cast<size_t>((all_logits ? T : 1) * c.vocab_size));
  const int64_t before = size();
  if (!model_.scheduler_->append(seq_, tokens, all_logits, logits.data(), cancel)) {
    if (c.n_full_layers() > 0) seq_.state.kv->truncate(seq_.state.n_past);  // give back the rest
    seq_.last_logits.clear();
    return make_error("append: cancelled after " + std::to_string(size() - before) + " of " + std::to_string(T) +
                      " tokens (those stay in the session)");
  }
  return logits;
}

Result<GenerateResult> Session::generate(const GenerateOptions& o, const std::function<bool(int32_t)>& on_token) {
  if (seq_.last_logits.empty()) return make_error("generate: the session is empty; append a prompt first");
  const ModelConfig& c = model_.config_;
  const bool kv = c.n_full_layers() > 0;
  if (kv && o.max_tokens > 0) {
    const int64_t room = std::min(o.max_tokens, c.max_position_embeddings - size());
    (void)seq_.state.kv->reserve(size() + std::max<int64_t>(room, 0));  // all or nothing; else per step
  }
  auto r = model_.scheduler_->generate(seq_, o, on_token);
  if (kv) seq_.state.kv->truncate(seq_.state.n_past);  // give back what was not used
  return r;
}

SessionCheckpoint Session::checkpoint() const {
  return SessionCheckpoint{seq_.tokens, seq_.state.gdn, seq_.last_logits};
}

Status Session::rewind(const SessionCheckpoint& cp) {
  std::vector<int32_t>& tokens = seq_.tokens;
  if (cp.tokens.size() > tokens.size() || !std::equal(cp.tokens.begin(), cp.tokens.end(), tokens.begin()))
    return make_error("rewind: the checkpoint's " + std::to_string(cp.tokens.size()) +
                      " tokens are not a prefix of this session's history");
  // Same layer count is not enough: another model's states (or another cache dtype's conv
  // windows) of other sizes would be read with this model's shapes.
  bool same_shape = cp.gdn.size() == seq_.state.gdn.size() &&
                    (cp.last_logits.empty() || cp.last_logits.size() == size_t(model_.config_.vocab_size));
  for (size_t l = 0; same_shape && l < cp.gdn.size(); ++l)
    same_shape = cp.gdn[l].conv.size() == seq_.state.gdn[l].conv.size() &&
                 cp.gdn[l].recurrent.size() == seq_.state.gdn[l].recurrent.size();
  if (!same_shape) return make_error("rewind: the checkpoint belongs to another model");
  tokens = cp.tokens;
  seq_.state.gdn = cp.gdn;
  seq_.state.n_past = int64_t(tokens.size());
  seq_.state.kv->truncate(seq_.state.n_past);
  seq_.last_logits = cp.last_logits;
  return {};
}

}  // namespace kiln::engine
