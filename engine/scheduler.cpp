#include "engine/scheduler.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>

namespace kiln::engine {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

// One call of append() or generate(), living on the caller's stack until done. GUARDED_BY(mu_)
// except what the step reads unlocked while in_step (tokens, out, the Sequence).
struct Scheduler::Request {
  Sequence* seq = nullptr;
  uint64_t arrival = 0;
  std::condition_variable done_cv;
  bool done = false;
  bool in_step = false;  // part of the step running now: only the scheduler may complete it
  bool is_generate = false;
  // append
  std::span<const int32_t> tokens;
  bool all_logits = false;
  float* out = nullptr;
  int64_t consumed = 0;
  // A long prefill (a whole conversation after compaction: minutes on a CPU) must not hold up a
  // cancelled build: planning a step looks at the flag and ends the append between chunks.
  const std::atomic<bool>* cancel = nullptr;
  bool cancelled = false;
  // generate
  const GenerateOptions* options = nullptr;
  std::optional<Sampler> sampler;
  bool has_callback = false;
  GenerateResult result;      // every sampled token; the last may not be forwarded yet
  size_t forwarded = 0;       // tokens in the history
  size_t acked = 0;           // tokens whose callback returned (all sampled ones without a callback)
  bool stopped = false;       // a callback returned false
  bool finishing = false;     // stop token or max_tokens reached
  bool in_callback = false;   // the session thread is inside on_token (the lock released)
  std::string error;

  int64_t remaining() const { return int64_t(tokens.size()) - consumed; }
  // Every token the callback saw is forwarded; the end was reached and every forwarded token
  // was reported. Never while a callback runs: the session thread finishes the request itself
  // when it returns (finishing it under the callback let both sides remove it from the queue).
  // An error ends it even when the token a stopping callback saw cannot be forwarded any more.
  bool can_finish() const {
    if (in_callback) return false;
    if (!error.empty()) return !has_callback || acked >= forwarded;
    if (stopped) return forwarded >= acked;
    if (finishing) return !has_callback || acked >= forwarded;
    return false;
  }
};

Scheduler::Scheduler(const Qwen35Model& network, const ModelConfig& config, int64_t prefill_chunk)
    : network_(network), config_(config), prefill_chunk_(std::max<int64_t>(1, prefill_chunk)),
      thread_([this] { run(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  thread_.join();
}

// Ready for a decode step: a sampled token not yet forwarded, and the callbacks of the tokens
// before it have returned true (or it was already reported: the callback ran ahead).
bool Scheduler::decode_ready(const Request& r) const {
  if (!r.is_generate || r.done || r.in_step || r.finishing || !r.error.empty()) return false;
  const size_t limit = r.stopped ? r.acked : r.acked + 1;
  return r.forwarded < r.result.tokens.size() && r.forwarded < limit;
}

bool Scheduler::append(Sequence& seq, std::span<const int32_t> tokens, bool all_logits, float* out,
                       const std::atomic<bool>* cancel) {
  Request r;
  r.seq = &seq;
  r.tokens = tokens;
  r.all_logits = all_logits;
  r.out = out;
  std::unique_lock<std::mutex> lock(mu_);
  r.arrival = arrivals_++;
  queue_.push_back(&r);
  work_.notify_one();
  r.cancel = cancel;
  r.done_cv.wait(lock, [&] { return r.done; });
  return !r.cancelled;
}

Result<GenerateResult> Scheduler::generate(Sequence& seq, const GenerateOptions& options,
                                           const std::function<bool(int32_t)>& on_token) {
  if (options.max_tokens <= 0) return GenerateResult{};
  Request r;
  r.seq = &seq;
  r.is_generate = true;
  r.options = &options;
  r.has_callback = bool(on_token);
  r.sampler.emplace(options.sampling);
  r.result.tokens.push_back(r.sampler->sample(seq.last_logits, std::span<const int32_t>()));  // nothing in flight: safe here
  if (!r.has_callback) r.acked = 1;
  std::unique_lock<std::mutex> lock(mu_);
  r.arrival = arrivals_++;
  queue_.push_back(&r);
  work_.notify_one();
  size_t called = 0;
  for (;;) {
    r.done_cv.wait(lock, [&] { return r.done || (r.has_callback && !r.stopped && called < r.result.tokens.size()); });
    if (r.done) break;
    const int32_t tok = r.result.tokens[called];
    r.in_callback = true;
    lock.unlock();
    bool go_on = false;
    std::exception_ptr thrown;
    try {
      go_on = on_token(tok);  // on this thread, possibly while the step forwards tok
    } catch (...) {
      thrown = std::current_exception();
    }
    lock.lock();
    r.in_callback = false;
    if (thrown) {  // stop, let the scheduler let go of the request, then pass the exception on
      r.acked = ++called;
      r.stopped = true;
      work_.notify_one();
      r.done_cv.wait(lock, [&] { return r.done || (!r.in_step && r.can_finish()); });
      if (auto it = std::find(queue_.begin(), queue_.end(), &r); it != queue_.end()) queue_.erase(it);
      std::rethrow_exception(thrown);
    }
    r.acked = ++called;
    if (!go_on) r.stopped = true;
    if (!r.in_step && r.can_finish()) {
      r.done = true;
      // Still queued unless the scheduler shut down (it then empties the queue itself).
      if (auto it = std::find(queue_.begin(), queue_.end(), &r); it != queue_.end()) queue_.erase(it);
      break;
    }
    work_.notify_one();
  }
  if (!r.error.empty()) return make_error(r.error);
  r.result.tokens.resize(r.forwarded);
  if (r.stopped) r.result.reason = GenerateResult::Reason::callback;
  return std::move(r.result);
}

const std::vector<Scheduler::Planned>& Scheduler::plan_step() {
  std::vector<Planned>& plan = plan_;
  std::vector<Request*>& prefill = prefill_;
  plan.clear(), prefill.clear();
  for (Request* r : queue_) {
    if (r->in_step || r->done) continue;
    if (r->is_generate) {
      if (!decode_ready(*r)) continue;
      SequenceState& st = r->seq->state;
      const int64_t n = st.n_past + 1;
      if (n > config_.max_position_embeddings) {
        r->error = "generate: context of " + std::to_string(n) + " tokens exceeds max_position_embeddings = " +
                   std::to_string(config_.max_position_embeddings);
      } else if (config_.n_full_layers() > 0) {
        Status s = st.kv->reserve(n);
        while (!s && reclaim_kv_ && reclaim_kv_()) s = st.kv->reserve(n);  // idle sessions' pages first
        if (!s) r->error = "generate: " + s.error();
      }
      if (!r->error.empty()) {
        if (r->can_finish()) {
          r->done = true;
          r->done_cv.notify_one();
        }
        continue;
      }
      plan.push_back({r, 1});
    } else if (r->cancel && r->cancel->load() && r->remaining() > 0) {
      r->cancelled = r->done = true;
      r->done_cv.notify_one();
    } else if (r->remaining() == 1) {
      plan.push_back({r, 1});  // a one-token append is a decode step
    } else if (r->remaining() > 1) {
      prefill.push_back(r);
    }
  }
  std::erase_if(queue_, [](Request* r) { return r->done; });
  std::stable_sort(prefill.begin(), prefill.end(),
                   [](const Request* a, const Request* b) { return a->seq->priority > b->seq->priority; });
  int64_t used = 0;
  for (Request* r : prefill) {
    const int64_t T = std::min(r->remaining(), prefill_chunk_);  // boundaries: multiples from the start
    if (used > 0 && used + T > prefill_chunk_) continue;         // a smaller one may still fit
    plan.push_back({r, T});
    used += T;
  }
  for (const Planned& p : plan) p.request->in_step = true;
  return plan;
}

void Scheduler::run() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<SeqStep> steps;
  std::vector<int32_t> decode_tokens;
  auto last_end = std::chrono::steady_clock::now();
  for (;;) {
    auto has_work = [&] {
      return stop_ || std::any_of(queue_.begin(), queue_.end(), [&](const Request* r) {
               return !r->in_step && !r->done && (r->is_generate ? decode_ready(*r) : r->remaining() > 0);
             });
    };
    work_.wait(lock, has_work);
    if (stop_) break;
    // Let generating sessions whose callback is still running catch this step (briefly).
    auto lagging = [&] {  // a sampled token waits on the callback of the one before it
      return std::any_of(queue_.begin(), queue_.end(), [](const Request* r) {
        return r->is_generate && r->has_callback && !r->done && !r->in_step && !r->stopped && !r->finishing &&
               r->error.empty() && r->forwarded < r->result.tokens.size() && r->acked < r->forwarded;
      });
    };
    if (lagging()) work_.wait_until(lock, last_end + linger_, [&] { return stop_ || !lagging(); });
    if (stop_) break;
    const std::vector<Planned>& plan = plan_step();
    if (plan.empty()) continue;
    steps.clear();
    decode_tokens.assign(plan.size(), 0);
    StepRecord rec;
    const int64_t V = config_.vocab_size;
    for (size_t i = 0; i < plan.size(); ++i) {
      Request& r = *plan[i].request;
      Sequence& seq = *r.seq;
      if (r.is_generate) {
        decode_tokens[i] = r.result.tokens[r.forwarded];
        steps.push_back({&decode_tokens[i], 1, &seq.state, LogitRows::last, seq.last_logits.data()});
      } else {
        const bool last = r.consumed + plan[i].T == int64_t(r.tokens.size());
        const LogitRows rows = r.all_logits ? LogitRows::all : last ? LogitRows::last : LogitRows::none;
        steps.push_back({r.tokens.data() + r.consumed, plan[i].T, &seq.state, rows,
                         r.all_logits ? r.out + r.consumed * V : r.out});
      }
      if (plan[i].T == 1) ++rec.decode_rows;
      else rec.prefill_rows += plan[i].T;
    }
    lock.unlock();
    rec.start_s = now_s();
    network_.forward_batch(steps, &rec.stats);
    rec.ms = (now_s() - rec.start_s) * 1e3;
    lock.lock();
    last_end = std::chrono::steady_clock::now();
    finish_step(plan);
    log_.push_back(rec);
    if (log_.size() > kStepLogSize) log_.pop_front();
  }
  for (Request* r : queue_) {  // only reached when the Model is destroyed with sessions in a call
    r->error = "engine: the model was unloaded";
    r->done = true;
    r->done_cv.notify_one();
  }
  queue_.clear();
}

void Scheduler::finish_step(const std::vector<Planned>& plan) {
  const int64_t V = config_.vocab_size;
  for (const Planned& p : plan) {
    Request& r = *p.request;
    Sequence& seq = *r.seq;
    r.in_step = false;
    if (!r.is_generate) {
      seq.tokens.insert(seq.tokens.end(), r.tokens.begin() + r.consumed, r.tokens.begin() + r.consumed + p.T);
      r.consumed += p.T;
      if (r.consumed < int64_t(r.tokens.size())) continue;
      const float* last = r.all_logits ? r.out + (int64_t(r.tokens.size()) - 1) * V : r.out;
      seq.last_logits.assign(last, last + V);
      r.done = true;
      r.done_cv.notify_one();
      continue;
    }
    const int32_t tok = r.result.tokens[r.forwarded++];
    seq.tokens.push_back(tok);
    const auto& stop = r.options->stop;
    if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
      r.finishing = true;
      r.result.reason = GenerateResult::Reason::stop_token;
    } else if (int64_t(r.forwarded) >= r.options->max_tokens) {
      r.finishing = true;
      r.result.reason = GenerateResult::Reason::max_tokens;
    } else if (!r.stopped) {
      r.result.tokens.push_back(
          r.sampler->sample(seq.last_logits, std::span<const int32_t>(r.result.tokens.data(), r.forwarded)));
      if (!r.has_callback) r.acked = r.result.tokens.size();
    }
    if (r.can_finish()) r.done = true;
    r.done_cv.notify_one();  // done, or a token for the callback
  }
  std::erase_if(queue_, [](Request* r) { return r->done; });
}

std::vector<StepRecord> Scheduler::step_log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {log_.begin(), log_.end()};
}

void Scheduler::clear_step_log() {
  std::lock_guard<std::mutex> lock(mu_);
  log_.clear();
}

}  // namespace kiln::engine
