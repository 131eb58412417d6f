#include "engine/engine.h"

#include "engine/cpu/denormals.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>

namespace kiln::engine {

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const EngineOptions& options) {
  // The last line of defence: loading reads outside input (JSON, headers, sizes), and an
  // exception escaping here would abort the process (or leave a server's model slot loading).
  try {
    // Quantizing at load runs chunks on this thread and on the pool's workers (which set the
    // engine's float mode): all of them round the same way, whatever mode the caller has.
    const cpu::EngineFloatModeScope float_mode;
    return load_checked(dir, options);
  } catch (const std::exception& e) {
    return make_error(dir + ": model failed to load: " + e.what());
  }
}

Result<std::unique_ptr<Model>> Model::load_checked(const std::string& dir, const EngineOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->options_ = options;
  auto config = load_model_config((std::filesystem::path(dir) / "config.json").string());
  if (!config) return make_error(config.error());
  m->config_ = std::move(config).value();
  Status gen = merge_generation_config(m->config_, (std::filesystem::path(dir) / "generation_config.json").string());
  if (!gen) return make_error(gen.error());
  auto ck = Checkpoint::open_dir(dir);
  if (!ck) return make_error(ck.error());
  m->checkpoint_ = std::move(ck).value();
  auto w = bind_weights(m->config_, *m->checkpoint_, dir);
  if (!w) return make_error(w.error());
  m->weights_ = std::move(w).value();
  if (options.max_sessions < 1) return make_error("engine options: max_sessions must be at least 1");
  m->plan_ = plan_capacity(m->config_, options.kv_budget_bytes, options.max_sessions, options.cache_dtype,
                           options.page_tokens, options.max_draft_tokens);
  if (m->config_.n_full_layers() > 0 && m->plan_.pages < 1)
    return make_error("KV budget of " + std::to_string(options.kv_budget_bytes) + " bytes leaves no KV page after " +
                      std::to_string(options.max_sessions) + " sessions' fixed state of " +
                      std::to_string(m->plan_.state_bytes_per_session + m->plan_.speculative_bytes_per_session) +
                      " bytes each");
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
  m->scheduler_->set_idle_kv({[model = m.get()] { return model->idle_kv_pages(); },
                              [model = m.get()] { return model->reclaim_idle_kv(); }});
  return m;
}

Model::~Model() = default;

// The scope of one Session call: holds call_mu_ (so the session's pages are not reclaimed under
// it) and records the time of last use. At its end the session's pages become reclaimable (and
// some may have been given back), so requests waiting for memory try again.
struct SessionCall {
  explicit SessionCall(const Session& s) : session(const_cast<Session&>(s)) { session.call_mu_.lock(); }
  ~SessionCall() {
    session.last_used_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
    session.call_mu_.unlock();
    session.model_.scheduler_->kv_released();
  }
  SessionCall(const SessionCall&) = delete;
  SessionCall& operator=(const SessionCall&) = delete;
  Session& session;
};

int64_t Model::idle_kv_pages() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  int64_t pages = 0;
  for (Session* s : sessions_) {
    if (!s->call_mu_.try_lock()) continue;  // inside a call: its pages are in use
    if (!s->reclaimed_) pages += s->seq_.state.kv->capacity_tokens() / s->seq_.state.kv->page_tokens();
    s->call_mu_.unlock();
  }
  return pages;
}

bool Model::reclaim_idle_kv() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  std::vector<Session*> idle = sessions_;
  std::sort(idle.begin(), idle.end(),
            [](const Session* a, const Session* b) { return a->last_used_ns_.load() < b->last_used_ns_.load(); });
  for (Session* s : idle) {
    if (!s->call_mu_.try_lock()) continue;  // inside a call: its pages are in use
    const bool has_pages = !s->reclaimed_ && s->seq_.state.kv->capacity_tokens() > 0;
    if (has_pages) {
      s->seq_.state.kv->truncate(0);  // its history and GDN state stay: checkpoint() still works
      s->reclaimed_ = true;
      ++kv_reclaims_;
    }
    s->call_mu_.unlock();
    if (has_pages) return true;
  }
  return false;
}

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
  seq_.order = model.session_order_++;
  seq_.state.dtype = model.options_.cache_dtype;
  seq_.state.kv = std::make_unique<SequenceKv>(*model.kv_pool_);
  model.network_->init_state(seq_.state);
  std::lock_guard<std::mutex> lock(model.sessions_mu_);
  model.sessions_.push_back(this);
}

Session::~Session() {
  {
    // Under sessions_mu_ no reclaim is looking at this session (it holds that lock throughout).
    std::lock_guard<std::mutex> lock(model_.sessions_mu_);
    model_.sessions_.erase(std::find(model_.sessions_.begin(), model_.sessions_.end(), this));
  }
  seq_.state.kv.reset();  // pages back to the pool
  model_.scheduler_->kv_released();
  model_.close_slot();
}

void Session::restart_history() {
  model_.network_->init_state(seq_.state);
  seq_.state.n_past = 0;
  reclaimed_ = false;
}

Result<std::vector<float>> Session::append(std::span<const int32_t> tokens, bool all_logits,
                                          const std::atomic<bool>* cancel) {
  SessionCall call(*this);
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
  if (reclaimed_) restart_history();
  std::vector<float> logits(static_cast<size_t>((all_logits ? T : 1) * c.vocab_size));
  const int64_t before = size();
  auto ran = model_.scheduler_->append(seq_, tokens, all_logits, logits.data(), cancel);
  if (!ran) return make_error(ran.error());
  if (!*ran) {
    if (c.n_full_layers() > 0) seq_.state.kv->truncate(seq_.state.n_past);  // give back the rest
    seq_.last_logits.clear();
    return make_error("append: cancelled after " + std::to_string(size() - before) + " of " + std::to_string(T) +
                      " tokens (those stay in the session)");
  }
  return logits;
}

Result<GenerateResult> Session::generate(const GenerateOptions& o, const std::function<bool(int32_t)>& on_token) {
  SessionCall call(*this);
  if (seq_.last_logits.empty()) return make_error("generate: the session is empty; append a prompt first");
  if (reclaimed_) restart_history();
  const ModelConfig& c = model_.config_;
  const bool kv = c.n_full_layers() > 0;
  if (kv && o.max_tokens > 0) {
    const int64_t room = std::min(o.max_tokens, c.max_position_embeddings - size());
    // All or nothing from the free pages, else per step. Speculative (a turn seldom uses all of
    // max_tokens), so it takes nothing from idle sessions; the per-step reservation does, when a
    // token really needs a page.
    (void)seq_.state.kv->reserve(size() + std::max<int64_t>(room, 0));
  }
  auto r = model_.scheduler_->generate(seq_, o, on_token);
  if (kv) seq_.state.kv->truncate(seq_.state.n_past);  // give back what was not used
  return r;
}

SessionCheckpoint Session::checkpoint() const {
  SessionCall call(*this);  // an idle reclaim leaves the GDN state as it is: still this history's
  if (seq_.state.n_past < size()) {  // a restore was cancelled part way: finish it first
    auto& self = const_cast<Session&>(*this);
    if (reclaimed_) self.restart_history();
    (void)model_.scheduler_->append(self.seq_, {}, false, nullptr);  // a session that ran is never refused
  }
  return SessionCheckpoint{seq_.tokens, seq_.state.gdn, seq_.last_logits};
}

Status Session::rewind(const SessionCheckpoint& cp) {
  SessionCall call(*this);
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
  // Only the checkpoint's tokens need their KV again (a restore cut short may already hold them).
  if (reclaimed_ || seq_.state.n_past < int64_t(cp.tokens.size())) {
    tokens.resize(cp.tokens.size());
    seq_.forget_after(int64_t(tokens.size()));
    restart_history();
    auto restored = model_.scheduler_->append(seq_, {}, false, nullptr);
    if (!restored) return make_error("rewind: " + restored.error());
  }
  tokens = cp.tokens;
  seq_.forget_after(int64_t(tokens.size()));
  seq_.state.gdn = cp.gdn;
  seq_.state.n_past = int64_t(tokens.size());
  seq_.state.kv->truncate(seq_.state.n_past);
  seq_.last_logits = cp.last_logits;
  return {};
}

}  // namespace kiln::engine
