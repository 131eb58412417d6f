// The scheduler: the one thread of a Model that runs forward passes. Sessions hand it work and
// block until their result is ready, so agent threads call sessions as plain blocking functions
// while their steps are batched:
//
//   every step = one decode token of every generating session (and every 1-token append)
//              + pending prefill, highest priority first (then oldest), up to `prefill_chunk`
//                tokens per step, a long prompt cut into chunks of prefill_chunk tokens
//
// so a 30k-token prefill delays the others by at most one chunk per step.
//
// KV memory: the scheduler reserves each sequence's pages before the step that needs them (an
// append's whole length at its first chunk, a decode token at a time), highest rank first (rank:
// priority, then the older session). When the pool is short it takes, in this order, the unused
// speculative pages of generating sessions, the pages of idle sessions (through IdleKv: their
// history is re-prefilled on their next call), and the pages of lower-ranked sessions inside a
// call, which are preempted: their history is re-prefilled ("restored") before they go on, with
// the same results. A session that has run before is never failed for memory: when nothing can be
// taken it waits until pages are given back. Only a new session (no tokens yet) is refused,
// untouched, with "context memory exhausted", and so is any context needing more than the pool. Chunk boundaries of an
// append depend only on that append (multiples of prefill_chunk from its start), and the forward
// pass computes each sequence independently of its batch-mates: a session's logits are the same
// whichever sessions it shares steps with.
//
// Speculative decoding (GenerateOptions::speculative): a generating session's step may carry a
// prompt-lookup draft after its token, verified in the decode form; tokens are sampled as in a
// plain loop and kept while they equal the draft, so the output is that of plain decoding in fewer
// steps (plan_drafts decides how much of a draft is expected to pay).
//
// generate() is driven by the scheduler: after each step it samples the session's next token
// (its own Sampler) and checks stop tokens and max_tokens. The on_token callback runs on the
// session's own thread, overlapped with the step that forwards that token (a slow callback
// never stalls the others; its session just misses steps). Semantics match a plain loop of
// sample → append → callback: a token reported to the callback is in the history.
//
// Threading: one scheduler thread owns the forward passes; its mutex guards the queue and every
// Request; a Sequence is touched by the scheduler only while its session's request is queued
// (the session thread is then inside append()/generate() and touches it only under the mutex).
// No lock is held while the forward pass or a callback runs.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/cache/sequence_state.h"
#include "engine/config.h"
#include "engine/models/qwen35.h"
#include "engine/prompt_lookup.h"
#include "engine/sampling.h"
#include "engine/status.h"

namespace kiln::engine {

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop;  // generation ends after emitting one of these
  // Ends the call with an error while it waits for KV memory (when no token, and so no
  // on_token callback, comes); while tokens come, the callback returning false is the way.
  const std::atomic<bool>* cancel = nullptr;
  // Prompt-lookup speculative decoding (engine/prompt_lookup.h): the tokens, the history and the
  // RNG draws are the same as without it; only the number of steps changes.
  SpeculativeOptions speculative;
};

inline constexpr double kAcceptancePrior = 0.8;  // drafts come from text that recurred
inline constexpr double kAcceptanceRate = 0.2;   // weight of each verified position
inline constexpr double kAcceptanceDrift = 0.02; // per step a draft was found but not tried

struct GenerateResult {
  std::vector<int32_t> tokens;
  enum class Reason { stop_token, max_tokens, callback } reason = Reason::max_tokens;
  int64_t steps = 0;           // forward passes that produced tokens
  int64_t draft_tokens = 0;    // speculative tokens verified
  int64_t draft_accepted = 0;  // of which the model's own choice (each saved a step)
  // Verifications that ended where the model chose otherwise than the draft. The rest of
  // draft_tokens were never judged: after a rejection, or cut off by a stop token or a callback
  // stop (drafts are never longer than the token budget leaves).
  int64_t draft_rejected = 0;
  // The session's estimate that a draft token is accepted, as this call left it (what its next
  // drafting decisions start from).
  double draft_acceptance = kAcceptancePrior;
};

// What the scheduler reads and writes of one session.
struct Sequence {
  SequenceState state;
  std::vector<int32_t> tokens;     // the history
  std::vector<float> last_logits;  // [V] after the last position; empty before the first append
  int priority = 0;                // higher: prefill admitted first, and ranked above for KV memory
  uint64_t order = 0;              // the session's opening order: at equal priority the older ranks above
  bool started = false;            // has run tokens: from then on never refused for memory, only delayed
  bool refused_for_memory = false; // the last append was refused: running sessions held the pages
  // History positions re-prefilled because the KV pages were taken (idle reclaim or preemption).
  // Positions [state.n_past, tokens.size()) are such a gap until the scheduler restores them.
  int64_t rebuilt_tokens = 0;
  // How the history was computed, so that a restore recomputes it bit for bit: runs of
  // positions, each one prompt chunk (prefilled in one step: the chunked forms depend on where a
  // step starts) or tokens decoded one at a time (the decode form, which a sequential step
  // reproduces however the run is split).
  struct Run {
    int64_t end = 0;  // one past the run's last position
    bool decoded = false;
  };
  std::vector<Run> runs;
  // The last n tokens of `tokens` were computed as one prompt chunk, or decoded.
  void note_computed(int64_t n, bool decoded) {
    const int64_t end = int64_t(tokens.size());
    if (decoded && !runs.empty() && runs.back().decoded && runs.back().end == end - n) runs.back().end = end;
    else runs.push_back({end, decoded});
  }
  // The history was cut to n tokens (rewind, rollback).
  void forget_after(int64_t n) {
    while (!runs.empty() && (runs.size() == 1 ? 0 : runs[runs.size() - 2].end) >= n) runs.pop_back();
    if (!runs.empty() && runs.back().end > n) runs.back().end = n;
  }
  // The next restore step from position `from`: how many positions, and whether they are replayed
  // in the decode form (a decoded run, at most `cap` of it) or as the prompt chunk they were.
  int64_t restore_step(int64_t from, int64_t cap, bool& decoded) const {
    int64_t start = 0;
    for (const Run& run : runs) {
      if (run.end > from) {
        decoded = run.decoded;
        // A chunk is replayed whole; one entered part way (only after a cut) from where it is.
        return decoded ? std::min(run.end - from, cap) : run.end - std::max(start, from);
      }
      start = run.end;
    }
    decoded = false;  // not recorded (cannot happen): as a prompt chunk
    return std::min(int64_t(tokens.size()) - from, cap);
  }
  // Speculative decoding: the estimated chance that a draft token is accepted (a moving average
  // over verified positions; it drifts back to the prior while drafts are not tried).
  double draft_acceptance = kAcceptancePrior;
};

// One finished step, for benches (Scheduler::step_log).
struct StepRecord {
  double start_s = 0, ms = 0;  // steady-clock seconds at start; duration
  int decode_rows = 0;         // sequences that brought one token (or a token and a draft)
  int64_t draft_rows = 0;      // draft tokens verified
  int64_t prefill_rows = 0;    // tokens of sequences that brought more than one
  StepStats stats;
};

class Scheduler {
 public:
  Scheduler(const Qwen35Model& network, const ModelConfig& config, int64_t prefill_chunk);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Restores seq's history gap, then runs `tokens` (ids valid; may be empty: only the restore)
  // after its history and writes logits of every position (all_logits, out [T][V]) or of the last
  // (out [V]). Blocks until done (true), or until *cancel is set: then it returns false at the
  // next step (after at most the chunk in flight), with the chunks already run in seq's history
  // and seq.last_logits not updated. An error when memory refuses a new session or the context
  // needs more KV pages than the pool has; nothing has run then.
  Result<bool> append(Sequence& seq, std::span<const int32_t> tokens, bool all_logits, float* out,
                      const std::atomic<bool>* cancel = nullptr);

  // Samples from seq.last_logits (non-empty), forwarding each sampled token, until a stop
  // token, max_tokens, or on_token returns false. KV for each token is reserved before its step
  // (see above: the session may be delayed or preempted, not failed); a context longer than
  // max_position_embeddings or than the whole pool ends it with an error (tokens kept in history).
  Result<GenerateResult> generate(Sequence& seq, const GenerateOptions& options,
                                  const std::function<bool(int32_t)>& on_token);

  int64_t prefill_chunk() const { return prefill_chunk_; }
  // The KV pages of sessions not inside a call, which the scheduler may take (called on the
  // scheduler thread, under its lock). Set once, before any call.
  struct IdleKv {
    std::function<int64_t()> pages;     // how many pages idle sessions hold
    std::function<bool()> reclaim_one;  // frees the least recently used one's; false if none
  };
  void set_idle_kv(IdleKv idle) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_kv_ = std::move(idle);
  }
  // Pages were given back or became reclaimable (a session call ended, a session closed):
  // requests waiting for memory try again.
  void kv_released();
  // Sessions preempted inside a call so far (their pages taken by a higher-ranked one).
  int64_t preemptions() const { return preemptions_.load(); }
  // Calls that had to wait for KV memory (no page could be taken for them).
  int64_t kv_waits() const { return kv_waits_.load(); }
  // New sessions' first calls refused for KV memory (each try counts).
  int64_t kv_refusals() const { return kv_refusals_.load(); }
  // The last steps (at most kStepLogSize), oldest first; clear_step_log() empties it.
  std::vector<StepRecord> step_log() const;
  void clear_step_log();
  static constexpr size_t kStepLogSize = 1 << 16;

 private:
  struct Request;
  struct Planned {
    Request* request;
    int64_t T;
    bool restore;  // T tokens of the history gap, not new work
    bool decoded = false;  // a restore of decoded tokens: replayed in the decode form
  };
  void run();
  const std::vector<Planned>& plan_step();
  void finish_step(const std::vector<Planned>& plan);
  bool decode_ready(const Request& r) const;
  bool wants_step(const Request& r) const;
  bool cancel_requested(const Request& r) const;
  // Reserves the KV that p's step needs, taking pages as described at the top; false when p must
  // wait (or was refused: it is then finished with the error).
  bool secure_kv(const Planned& p);
  void preempt(Request& victim);
  void fail(Request& r, std::string error);
  // Speculative decoding: adds prompt-lookup drafts to the planned generate steps where they are
  // expected to pay (see scheduler.cpp), learns from each verification, undoes unreported tokens.
  void plan_drafts(std::vector<Planned>& plan);
  void note_verified(Request& r, int64_t accepted, bool rejected);
  double draft_row_cost(int64_t plain_rows) const;
  void note_step_time(int64_t plain_rows, int64_t draft_rows, double ms);
  void roll_back_unreported(Request& r);

  const Qwen35Model& network_;
  const ModelConfig& config_;
  const int64_t prefill_chunk_;
  // How long a step waits for a generating session whose callback has not returned yet.
  const std::chrono::microseconds linger_{1000};

  mutable std::mutex mu_;
  std::condition_variable work_;
  std::vector<Request*> queue_;  // GUARDED_BY(mu_): in arrival order
  uint64_t arrivals_ = 0;        // GUARDED_BY(mu_)
  bool stop_ = false;            // GUARDED_BY(mu_)
  std::deque<StepRecord> log_;   // GUARDED_BY(mu_)
  std::vector<Planned> plan_;    // scheduler thread only: reused every step
  std::vector<Request*> prefill_;
  std::vector<int32_t> draft_;   // scheduler thread only
  // The draft cost model (scheduler thread only): plain decode-only step durations by rows (0:
  // none yet), a draft row's learned cost per step-size bucket (0: none yet), and the prior
  // for a one-row step (a MoE's draft tokens read experts of their own).
  std::array<double, 65> plain_ms_by_rows_{};
  std::array<double, 6> draft_row_cost_{};
  const double row_cost_prior_;
  IdleKv idle_kv_;                // GUARDED_BY(mu_)
  uint64_t kv_epoch_ = 0;         // GUARDED_BY(mu_): bumped whenever pages may have come free
  uint64_t plan_number_ = 0;      // scheduler thread only
  std::atomic<int64_t> preemptions_{0};
  std::atomic<int64_t> kv_waits_{0};
  std::atomic<int64_t> kv_refusals_{0};
  std::thread thread_;           // last: starts after everything above exists
};

}  // namespace kiln::engine
