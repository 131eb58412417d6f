// The scheduler: the one thread of a Model that runs forward passes. Sessions hand it work and
// block until their result is ready, so agent threads call sessions as plain blocking functions
// while their steps are batched:
//
//   every step = one decode token of every generating session (and every 1-token append)
//              + pending prefill, highest priority first (then oldest), up to `prefill_chunk`
//                tokens per step, a long prompt cut into chunks of prefill_chunk tokens
//
// so a 30k-token prefill delays the others by at most one chunk per step. Chunk boundaries of an
// append depend only on that append (multiples of prefill_chunk from its start), and the forward
// pass computes each sequence independently of its batch-mates: a session's logits are the same
// whichever sessions it shares steps with.
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
#include "engine/sampling.h"
#include "engine/status.h"

namespace kiln::engine {

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop;  // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  enum class Reason { stop_token, max_tokens, callback } reason = Reason::max_tokens;
};

// What the scheduler reads and writes of one session.
struct Sequence {
  SequenceState state;
  std::vector<int32_t> tokens;     // the history
  std::vector<float> last_logits;  // [V] after the last position; empty before the first append
  int priority = 0;                // higher: prefill admitted first
};

// One finished step, for benches (Scheduler::step_log).
struct StepRecord {
  double start_s = 0, ms = 0;  // steady-clock seconds at start; duration
  int decode_rows = 0;         // sequences that brought one token
  int64_t prefill_rows = 0;    // tokens of sequences that brought more than one
  StepStats stats;
};

class Scheduler {
 public:
  Scheduler(const Qwen35Model& network, const ModelConfig& config, int64_t prefill_chunk);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs `tokens` after seq's history (ids valid, KV reserved by the caller) and writes logits
  // of every position (all_logits, out [T][V]) or of the last (out [V]). Blocks until done, or
  // until *cancel is set: then it returns false at the next step (after at most the chunk in
  // flight), with the chunks already run in seq's history and seq.last_logits not updated.
  bool append(Sequence& seq, std::span<const int32_t> tokens, bool all_logits, float* out,
              const std::atomic<bool>* cancel = nullptr);

  // Samples from seq.last_logits (non-empty), forwarding each sampled token, until a stop
  // token, max_tokens, or on_token returns false. KV for each token is reserved before its step;
  // "context memory exhausted" / the context limit end it with an error (tokens kept in history).
  Result<GenerateResult> generate(Sequence& seq, const GenerateOptions& options,
                                  const std::function<bool(int32_t)>& on_token);

  int64_t prefill_chunk() const { return prefill_chunk_; }
  // Called (on the scheduler thread, under its lock) when a generating session's next KV page is
  // not free: frees an idle session's pages and says whether it did. Set once, before any call.
  void set_kv_reclaimer(std::function<bool()> reclaim) {
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_kv_ = std::move(reclaim);
  }
  // The last steps (at most kStepLogSize), oldest first; clear_step_log() empties it.
  std::vector<StepRecord> step_log() const;
  void clear_step_log();
  static constexpr size_t kStepLogSize = 1 << 16;

 private:
  struct Request;
  struct Planned {
    Request* request;
    int64_t T;
  };
  void run();
  const std::vector<Planned>& plan_step();
  void finish_step(const std::vector<Planned>& plan);
  bool decode_ready(const Request& r) const;

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
  std::function<bool()> reclaim_kv_;  // GUARDED_BY(mu_)
  std::thread thread_;           // last: starts after everything above exists
};

}  // namespace kiln::engine
