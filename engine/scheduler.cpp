#include "engine/scheduler.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>

#include "engine/cpu/denormals.h"

namespace kiln::engine {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// History positions whose KV and state were taken and must be re-prefilled first.
int64_t history_gap(const Sequence& s) { return int64_t(s.tokens.size()) - s.state.n_past; }

// True when a ranks below b for KV memory: lower priority, or equal and opened later.
bool ranks_below(const Sequence& a, const Sequence& b) {
  return a.priority != b.priority ? a.priority < b.priority : a.order > b.order;
}

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
  // Speculative decoding: `verify` is the step's tokens (the pending one, then the draft), its
  // logits [T][V] and what rolls the GDN states back to any position but the last. They stay until
  // the next step: a callback that stops inside the accepted run rolls the history back to its token.
  std::vector<int32_t> verify;
  std::vector<float> verify_logits;
  GdnRollback gdn_rollback;
  size_t verify_first = 0;  // result index of verify[0]
  int64_t verify_kept = 0;  // positions of the last verification kept in the history
  std::string error;
  // KV memory: waiting for pages (skipped until kv_epoch_ moves past stalled_epoch); preempted
  // while the step being planned was put together (its planned work is void).
  bool kv_stalled = false;
  uint64_t stalled_epoch = 0;
  uint64_t preempted_in_plan = 0;
  bool waited_for_kv = false;

  int64_t remaining() const { return int64_t(tokens.size()) - consumed; }
  // Every token the callback saw is forwarded; the end was reached and every forwarded token
  // was reported. Never while a callback runs: the session thread finishes the request itself
  // when it returns (finishing it under the callback let both sides remove it from the queue).
  // An error ends it even when the token a stopping callback saw cannot be forwarded any more.
  bool can_finish() const {
    if (in_callback) return false;
    // (A stopped callback sees no more tokens: the unreported ones are rolled back instead.)
    if (!error.empty()) return !has_callback || stopped || acked >= forwarded;
    if (stopped) return forwarded >= acked;
    if (finishing) return !has_callback || acked >= forwarded;
    return false;
  }
};

Scheduler::Scheduler(const Qwen35Model& network, const ModelConfig& config, int64_t prefill_chunk)
    : network_(network), config_(config), prefill_chunk_(std::max<int64_t>(1, prefill_chunk)),
      row_cost_prior_(config.is_moe ? 0.6 : 0.15),
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

Result<bool> Scheduler::append(Sequence& seq, std::span<const int32_t> tokens, bool all_logits, float* out,
                               const std::atomic<bool>* cancel) {
  Request r;
  r.seq = &seq;
  seq.refused_for_memory = false;
  r.tokens = tokens;
  r.all_logits = all_logits;
  r.out = out;
  std::unique_lock<std::mutex> lock(mu_);
  r.arrival = arrivals_++;
  queue_.push_back(&r);
  ++kv_epoch_;  // a newcomer can be preempted by a waiting higher-ranked request: it retries
  work_.notify_one();
  r.cancel = cancel;
  r.done_cv.wait(lock, [&] { return r.done; });
  if (!r.error.empty()) return make_error(r.error);
  return !r.cancelled;
}

void Scheduler::kv_released() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++kv_epoch_;
  }
  work_.notify_one();
}

// A request to end now for its cancel flag: an append with work left (waiting for memory or not),
// or a generate waiting for memory (stalled, or preempted and not restored yet): a generate's
// callback sees the cancel while tokens come, but none come while it waits.
bool Scheduler::cancel_requested(const Request& r) const {
  if (r.in_step || r.done) return false;
  const int64_t gap = history_gap(*r.seq);
  if (!r.is_generate) return r.cancel != nullptr && r.cancel->load() && (r.remaining() > 0 || gap > 0);
  return (r.kv_stalled || gap > 0) && r.options->cancel != nullptr && r.options->cancel->load() && r.error.empty();
}

bool Scheduler::wants_step(const Request& r) const {
  if (r.in_step || r.done) return false;
  if (r.kv_stalled && r.stalled_epoch == kv_epoch_) return false;
  return r.is_generate ? decode_ready(r) : true;  // an append always has something to do or finish
}

void Scheduler::fail(Request& r, std::string error) {
  r.error = std::move(error);
  if (r.is_generate && !r.can_finish()) return;  // its session thread finishes it after the callback
  r.done = true;
  r.done_cv.notify_one();
}

void Scheduler::preempt(Request& victim) {
  SequenceState& st = victim.seq->state;
  st.kv->truncate(0);
  network_.init_state(st);  // restored from the first token: the whole history is re-run
  st.n_past = 0;
  victim.preempted_in_plan = plan_number_;
  ++preemptions_;
  ++kv_epoch_;  // pages came free: requests that wait for memory try again
}

bool Scheduler::secure_kv(const Planned& p) {
  Request& r = *p.request;
  Sequence& seq = *r.seq;
  SequenceKv& kv = *seq.state.kv;
  const KvPool& pool = kv.pool();
  // A restore reserves the whole history and the work behind it, an append all its tokens at its
  // first chunk (a new session is admitted all or nothing), a decode its token and any draft.
  const int64_t pending = r.is_generate ? (p.restore ? 1 : p.T) : r.remaining();
  const int64_t need = p.restore ? int64_t(seq.tokens.size()) + pending : seq.state.n_past + pending;
  const int64_t pt = kv.page_tokens();
  const int64_t pages_needed = (need + pt - 1) / pt;
  if (pages_needed > pool.max_pages()) {
    fail(r, "context memory exhausted: a context of " + std::to_string(need) + " tokens needs " +
                std::to_string(pages_needed) + " KV pages and the pool has " + std::to_string(pool.max_pages()) +
                " (" + std::to_string(pool.max_pages() * pt) + " tokens); raise the KV budget");
    return false;
  }
  if (kv.reserve(need)) return true;
  auto pages_of = [](const Sequence& s) { return s.state.kv->capacity_tokens() / s.state.kv->page_tokens(); };
  // 1. Speculative pages of generating sessions (reserved for max_tokens, not yet needed).
  const int64_t in_use = pool.pages_in_use();
  for (Request* o : queue_)
    if (o != &r && o->is_generate && !o->done && o->seq->state.kv->capacity_tokens() > 0)
      o->seq->state.kv->truncate(int64_t(o->seq->tokens.size()) + 1);  // its history and its next token (no draft)
  if (pool.pages_in_use() < in_use) ++kv_epoch_;
  if (kv.reserve(need)) return true;
  // 2. Idle sessions, then 3. lower-ranked calls, lowest first; nothing is taken unless it is enough.
  std::vector<Request*> victims;
  for (Request* o : queue_)
    if (o != &r && !o->done && o->seq != &seq && pages_of(*o->seq) > 0 && ranks_below(*o->seq, seq))
      victims.push_back(o);
  std::sort(victims.begin(), victims.end(), [](const Request* a, const Request* b) { return ranks_below(*a->seq, *b->seq); });
  int64_t reachable = pool.max_pages() - pool.pages_in_use() + (idle_kv_.pages ? idle_kv_.pages() : 0);
  for (const Request* v : victims) reachable += pages_of(*v->seq);
  if (reachable >= pages_needed - pages_of(seq)) {
    for (size_t next = 0;;) {
      if (kv.reserve(need)) return true;
      if (idle_kv_.reclaim_one && idle_kv_.reclaim_one()) continue;
      if (next == victims.size()) break;
      preempt(*victims[next++]);
    }
  }
  if (!seq.started) {  // a new session: refused, untouched
    seq.refused_for_memory = true;
    ++kv_refusals_;
    fail(r, "context memory exhausted: " + std::to_string(need) + " tokens need " + std::to_string(pages_needed) +
                " KV pages; " + std::to_string(pool.max_pages() - pool.pages_in_use()) + " of " +
                std::to_string(pool.max_pages()) + " are free and the rest are held by running sessions; " +
                "try again later, or raise the KV budget");
    return false;
  }
  r.kv_stalled = true;  // waits, keeping its pages, until some are given back
  r.stalled_epoch = kv_epoch_;
  if (!r.waited_for_kv) ++kv_waits_;
  r.waited_for_kv = true;
  return false;
}

Result<GenerateResult> Scheduler::generate(Sequence& seq, const GenerateOptions& options,
                                           const std::function<bool(int32_t)>& on_token) {
  // The session is in no queue between its calls: its estimate is read here unlocked.
  if (options.max_tokens <= 0) {
    GenerateResult nothing;
    nothing.draft_acceptance = seq.draft_acceptance;
    return nothing;
  }
  Request r;
  r.seq = &seq;
  r.is_generate = true;
  r.result.draft_acceptance = seq.draft_acceptance;
  r.options = &options;
  r.has_callback = bool(on_token);
  r.sampler.emplace(options.sampling);
  {
    // Sampled here, on the session thread; every later token on the scheduler's: both in the
    // engine's float mode, so a sampled run does not depend on the caller's rounding mode.
    const cpu::EngineFloatModeScope float_mode;
    r.result.tokens.push_back(r.sampler->sample(seq.last_logits, std::span<const int32_t>()));  // nothing in flight: safe here
  }
  if (!r.has_callback) r.acked = 1;
  std::unique_lock<std::mutex> lock(mu_);
  r.arrival = arrivals_++;
  queue_.push_back(&r);
  ++kv_epoch_;  // a newcomer can be preempted by a waiting higher-ranked request: it retries
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
      lock.unlock();
      roll_back_unreported(r);
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
  lock.unlock();
  roll_back_unreported(r);
  if (!r.error.empty()) return make_error(r.error);
  r.result.tokens.resize(r.forwarded);
  if (r.stopped) r.result.reason = GenerateResult::Reason::callback;
  return std::move(r.result);
}

// A callback that stopped at a token inside the last verified draft: the accepted tokens after it
// were forwarded but never reported, and leave the history (the GDN state is replayed up to the
// stopping token). Called on the session thread once the request is done and out of the queue,
// without mu_: nothing else touches the sequence now (the scheduler only through queued requests,
// an idle reclaim not during the session's call), so the replay, on this thread without the
// pool, does not hold up the other sessions' steps. It runs in the engine's float mode, as the
// scheduler thread does, so it reaches the same bits.
void Scheduler::roll_back_unreported(Request& r) {
  if (!r.stopped || r.forwarded <= r.acked || r.acked <= r.verify_first) return;
  const size_t position = r.acked - 1 - r.verify_first;  // < verify_kept − 1: a recorded position
  if (int64_t(position) + 1 >= r.verify_kept || int64_t(position) >= r.gdn_rollback.positions) return;
  Sequence& seq = *r.seq;
  const size_t drop = r.forwarded - r.acked;
  const bool computed = history_gap(seq) == 0;  // else preempted since: a restore recomputes it
  seq.tokens.resize(seq.tokens.size() - drop);
  seq.forget_after(int64_t(seq.tokens.size()));
  if (computed) {
    seq.state.n_past -= int64_t(drop);
    const cpu::EngineFloatModeScope float_mode;
    network_.roll_back_gdn(r.gdn_rollback, int64_t(position) + 1, seq.state, nullptr);  // session thread: no pool
  } else if (seq.state.n_past > int64_t(seq.tokens.size())) {  // restored past the cut: again from 0
    network_.init_state(seq.state);
    seq.state.n_past = 0;
  }
  const int64_t V = config_.vocab_size;
  seq.last_logits.assign(r.verify_logits.begin() + int64_t(position) * V,
                         r.verify_logits.begin() + int64_t(position + 1) * V);
  r.forwarded = r.acked;
}

// Speculative decoding pays when the tokens it is expected to add outweigh the time its extra
// rows add to the step (for a MoE, each draft token reads experts of its own: on a CPU one costs
// ~0.6 of a one-token step). For each generating request, in plan order, the draft length (up to
// what prompt lookup proposes) maximises the step's expected tokens per unit of time
// (draft_length), with the session's acceptance estimate and draft_row_cost().
void Scheduler::plan_drafts(std::vector<Planned>& plan) {
  int64_t plain_rows = 0;
  double tokens = 0;
  for (const Planned& p : plan) {
    plain_rows += p.T;
    tokens += p.request->is_generate && !p.restore ? 1 : 0;
  }
  const double per_row = draft_row_cost(plain_rows);
  const auto cost = [&](int64_t rows) { return 1 + per_row * double(rows - plain_rows); };
  int64_t rows = plain_rows;
  for (Planned& p : plan) {
    Request& r = *p.request;
    if (!r.is_generate || p.restore) continue;
    const SpeculativeOptions& o = r.options->speculative;
    if (o.draft_tokens <= 0 || r.stopped) continue;
    const Sequence& seq = *r.seq;
    // The step's own token counts against max_tokens and the context as well.
    const int64_t room = std::min({int64_t(o.draft_tokens), r.options->max_tokens - int64_t(r.forwarded) - 1,
                                   config_.max_position_embeddings - seq.state.n_past - 1});
    if (room <= 0) continue;
    propose_draft(seq.tokens, r.verify[0], o, room, draft_);
    if (draft_.empty()) continue;
    const double q = seq.draft_acceptance;
    double gain = double(draft_.size());
    const int64_t k = o.adaptive ? draft_length(q, tokens, rows, int64_t(draft_.size()), cost, &gain)
                                 : int64_t(draft_.size());
    if (k == 0) {  // not worth it now; drift back so that the session is tried again later
      r.seq->draft_acceptance += kAcceptanceDrift * (kAcceptancePrior - q);
      continue;
    }
    r.verify.insert(r.verify.end(), draft_.begin(), draft_.begin() + k);
    p.T = 1 + k;
    rows += k;
    tokens += gain;
  }
}

// Per judged draft position: accepted ones count 1, the rejected one (if any) 0. Positions after
// a stop token or a callback stop were never judged and do not count.
void Scheduler::note_verified(Request& r, int64_t accepted, bool rejected) {
  double& q = r.seq->draft_acceptance;
  for (int64_t i = 0; i < accepted; ++i) q += kAcceptanceRate * (1 - q);
  if (rejected) q += kAcceptanceRate * (0 - q);
}

// A draft row's cost as a fraction of a step of `plain_rows` rows: learned per bucket of step
// size (1, 2, 3–4, 5–8, 9–16, 17+ rows) from decode steps that carried drafts, against the recent
// plain decode steps of the same size; before that, the prior c / rows (a row's share of a step
// shrinks as the step grows: in a batch most experts are read anyway).
namespace {
size_t size_bucket(int64_t rows) { return rows <= 1 ? 0 : rows <= 2 ? 1 : rows <= 4 ? 2 : rows <= 8 ? 3 : rows <= 16 ? 4 : 5; }
}  // namespace

double Scheduler::draft_row_cost(int64_t plain_rows) const {
  const double learned = draft_row_cost_[size_bucket(plain_rows)];
  return learned > 0 ? learned : row_cost_prior_ / double(std::max<int64_t>(1, plain_rows));
}

// Decode-only steps teach the cost model: plain ones their duration by size, those with drafts
// the extra a draft row took. A sample is clamped to twice the prior, so one slow step (the first
// to touch memory-mapped experts) cannot stop drafting for good.
void Scheduler::note_step_time(int64_t plain_rows, int64_t draft_rows, double ms) {
  if (plain_rows < 1 || plain_rows >= int64_t(plain_ms_by_rows_.size())) return;
  double& plain = plain_ms_by_rows_[size_t(plain_rows)];
  if (draft_rows == 0) {
    plain = plain > 0 ? plain + 0.1 * (ms - plain) : ms;
    return;
  }
  if (plain <= 0) return;
  const double prior = row_cost_prior_ / double(plain_rows);
  const double sample = std::clamp((ms / plain - 1) / double(draft_rows), 0.0, 2 * prior);
  double& learned = draft_row_cost_[size_bucket(plain_rows)];
  learned = (learned > 0 ? learned : prior) + 0.2 * (sample - (learned > 0 ? learned : prior));
}

const std::vector<Scheduler::Planned>& Scheduler::plan_step() {
  std::vector<Planned>& plan = plan_;
  std::vector<Request*>& prefill = prefill_;
  plan.clear(), prefill.clear();
  ++plan_number_;
  for (Request* r : queue_) {
    if (cancel_requested(*r)) {
      if (r->is_generate) {
        fail(*r, "generate: cancelled while waiting for KV memory");
      } else {
        r->cancelled = r->done = true;
        r->done_cv.notify_one();
      }
      continue;
    }
    if (!wants_step(*r)) continue;
    r->kv_stalled = false;
    const int64_t gap = history_gap(*r->seq);
    if (r->is_generate) {
      if (gap > 0) {
        prefill.push_back(r);  // preempted or reclaimed: its history first
        continue;
      }
      const int64_t n = r->seq->state.n_past + 1;
      if (n > config_.max_position_embeddings) {
        fail(*r, "generate: context of " + std::to_string(n) + " tokens exceeds max_position_embeddings = " +
                     std::to_string(config_.max_position_embeddings));
        continue;
      }
      r->verify.assign(1, r->result.tokens[r->forwarded]);
      plan.push_back({r, 1, false});  // drafts are added below, once the step's size is known
    } else if (gap > 0 || r->remaining() > 1) {
      prefill.push_back(r);
    } else if (r->remaining() == 1) {
      plan.push_back({r, 1, false});  // a one-token append is a decode step
    } else {
      r->done = true;  // only a restore was asked for, and there was nothing to restore
      r->done_cv.notify_one();
    }
  }
  std::stable_sort(prefill.begin(), prefill.end(),
                   [](const Request* a, const Request* b) { return a->seq->priority > b->seq->priority; });
  int64_t used = 0;
  for (Request* r : prefill) {
    const int64_t gap = history_gap(*r->seq);
    const bool restore = gap > 0;
    // Boundaries: multiples of the chunk from the start of the append; a restore replays the
    // history's own steps (Sequence::runs), so it recomputes the same bits.
    bool decoded = false;
    const int64_t T = restore ? r->seq->restore_step(r->seq->state.n_past, prefill_chunk_, decoded)
                              : std::min(r->remaining(), prefill_chunk_);
    if (used > 0 && used + T > prefill_chunk_) continue;  // a smaller one may still fit
    plan.push_back({r, T, restore, decoded});
    used += T;
  }
  plan_drafts(plan);
  if (config_.n_full_layers() > 0) {  // KV for every planned step, highest rank first
    std::vector<size_t> ranked(plan.size());
    for (size_t i = 0; i < ranked.size(); ++i) ranked[i] = i;
    std::stable_sort(ranked.begin(), ranked.end(),
                     [&](size_t a, size_t b) { return ranks_below(*plan[b].request->seq, *plan[a].request->seq); });
    for (size_t i : ranked) {
      Planned& p = plan[i];
      Request& r = *p.request;
      if (r.preempted_in_plan == plan_number_) {  // its planned work is void: it restores first
        p.T = 0;
        continue;
      }
      // A draft only uses pages the session holds or the pool has free; else it is dropped.
      if (p.T > 1 && r.is_generate && !p.restore && !r.seq->state.kv->reserve(r.seq->state.n_past + p.T)) {
        p.T = 1;
        r.verify.resize(1);
      }
      if (!secure_kv(p)) p.T = 0;
    }
    std::erase_if(plan, [](const Planned& p) { return p.T == 0; });
  }
  std::erase_if(queue_, [](Request* r) { return r->done; });
  for (const Planned& p : plan) p.request->in_step = true;
  return plan;
}

void Scheduler::run() {
  cpu::set_engine_float_mode();  // not whatever the thread that loaded the model had set
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<SeqStep> steps;
  std::vector<int32_t> decode_tokens;
  auto last_end = std::chrono::steady_clock::now();
  for (;;) {
    auto has_work = [&] {
      return stop_ || std::any_of(queue_.begin(), queue_.end(), [&](const Request* r) {
               return wants_step(*r) || cancel_requested(*r);
             });
    };
    // Nothing signals a cancel flag: while requests wait for memory, look at their flags often.
    if (std::any_of(queue_.begin(), queue_.end(), [](const Request* r) { return r->kv_stalled; }))
      work_.wait_for(lock, std::chrono::milliseconds(50), has_work);
    else
      work_.wait(lock, has_work);
    if (!has_work()) continue;
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
      if (plan[i].restore) {
        steps.push_back({seq.tokens.data() + seq.state.n_past, plan[i].T, &seq.state, LogitRows::none, nullptr,
                         plan[i].decoded});
      } else if (r.is_generate && plan[i].T > 1) {  // a token and its draft, verified in the decode form
        r.verify_logits.resize(size_t(plan[i].T * V));
        steps.push_back({r.verify.data(), plan[i].T, &seq.state, LogitRows::all, r.verify_logits.data(), true,
                         &r.gdn_rollback});
        rec.draft_rows += plan[i].T - 1;
      } else if (r.is_generate) {
        decode_tokens[i] = r.result.tokens[r.forwarded];
        steps.push_back({&decode_tokens[i], 1, &seq.state, LogitRows::last, seq.last_logits.data()});
      } else {
        const bool last = r.consumed + plan[i].T == int64_t(r.tokens.size());
        const LogitRows rows = r.all_logits ? LogitRows::all : last ? LogitRows::last : LogitRows::none;
        steps.push_back({r.tokens.data() + r.consumed, plan[i].T, &seq.state, rows,
                         r.all_logits ? r.out + r.consumed * V : r.out});
      }
      if (plan[i].T == 1 || (r.is_generate && !plan[i].restore)) ++rec.decode_rows;
      else rec.prefill_rows += plan[i].T;
    }
    lock.unlock();
    rec.start_s = now_s();
    network_.forward_batch(steps, &rec.stats);
    rec.ms = (now_s() - rec.start_s) * 1e3;
    lock.lock();
    last_end = std::chrono::steady_clock::now();
    if (rec.prefill_rows == 0) note_step_time(rec.decode_rows, rec.draft_rows, rec.ms);
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
    if (p.restore) {
      seq.rebuilt_tokens += p.T;
      if (!r.is_generate && r.remaining() == 0 && history_gap(seq) == 0) {  // a restore-only call
        r.done = true;
        r.done_cv.notify_one();
      }
      continue;
    }
    seq.started = true;
    if (!r.is_generate) {
      seq.tokens.insert(seq.tokens.end(), r.tokens.begin() + r.consumed, r.tokens.begin() + r.consumed + p.T);
      seq.note_computed(p.T, p.T == 1);  // forward_batch runs a one-token step in the decode form
      r.consumed += p.T;
      if (r.consumed < int64_t(r.tokens.size())) continue;
      const float* last = r.all_logits ? r.out + (int64_t(r.tokens.size()) - 1) * V : r.out;
      seq.last_logits.assign(last, last + V);
      r.done = true;
      r.done_cv.notify_one();
      continue;
    }
    // Position i forwarded result token `forwarded`; its logits give the next token, sampled as
    // in a plain loop. While that equals the draft's next token, the draft's next position is
    // the step a plain loop would have run next, already done.
    const int64_t T = p.T;
    const size_t first = r.forwarded;
    int64_t kept = 0;
    bool rejected = false;  // the model chose otherwise at a draft position (not a stop cutting it)
    while (kept < T) {
      const int32_t tok = r.result.tokens[r.forwarded++];
      seq.tokens.push_back(tok);
      const std::span<const float> logits =
          T == 1 ? std::span<const float>(seq.last_logits)
                 : std::span<const float>(r.verify_logits.data() + kept * V, size_t(V));
      ++kept;
      const auto& stop = r.options->stop;
      if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
        r.finishing = true;
        r.result.reason = GenerateResult::Reason::stop_token;
        break;
      }
      if (int64_t(r.forwarded) >= r.options->max_tokens) {
        r.finishing = true;
        r.result.reason = GenerateResult::Reason::max_tokens;
        break;
      }
      if (r.stopped) break;
      const int32_t next = r.sampler->sample(logits, std::span<const int32_t>(r.result.tokens.data(), r.forwarded));
      r.result.tokens.push_back(next);
      if (!r.has_callback) r.acked = r.result.tokens.size();
      if (kept == T) break;
      if (next != r.verify[size_t(kept)]) {
        rejected = true;
        break;
      }
    }
    seq.note_computed(kept, true);
    ++r.result.steps;
    if (T == 1) {
      r.verify_kept = 0;  // nothing recorded by this step: nothing to roll back into
    } else {
      r.result.draft_tokens += T - 1;
      r.result.draft_accepted += kept - 1;
      r.result.draft_rejected += rejected;
      r.verify_first = first;
      r.verify_kept = kept;
      seq.last_logits.assign(r.verify_logits.begin() + (kept - 1) * V, r.verify_logits.begin() + kept * V);
      if (kept < T) {  // the rejected positions leave the caches: KV by length, GDN by replaying the kept ones
        seq.state.n_past -= T - kept;
        network_.roll_back_gdn(r.gdn_rollback, kept, seq.state, network_.pool());
      }
      note_verified(r, kept - 1, rejected);
    }
    r.result.draft_acceptance = seq.draft_acceptance;
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
