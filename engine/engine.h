// kiln's in-process inference engine: the one header other folders include.
//
//   auto model = Model::load("models/tiny", EngineOptions{});     // mmap weights, plan capacity
//   auto session = (*model)->open_session();                       // one conversation
//   auto logits = (*session)->append(prompt_tokens);               // prefill only the new tokens
//   (*session)->generate(opts, [](int32_t tok) { ...; return true; });
//
// Threading: a Model may be shared by any number of threads. A Session is owned by one thread at
// a time (one agent); sessions on different threads run concurrently: their append/generate calls
// are queued to the Model's scheduler (engine/scheduler.h), the one thread that runs forward
// passes, which batches the decode steps of all sessions and chunks long prefills, and each call
// blocks until its result is ready. A Model must outlive its sessions.
//
// Admission: at most max_sessions are open. open_session() fails when they are all taken (or
// others wait in line); open_session_waiting() waits in line, highest priority first, reporting
// its position. KV memory is reserved by the scheduler before each step (engine/scheduler.h).
// When the pool is full it takes the pages of the least recently used idle session (one not
// inside a call: an agent running a tool), then preempts lower-ranked sessions inside a call
// (lower priority, or opened later); either re-prefills its history before going on (counted in
// rebuilt_tokens()), with the same results. A session that has run is never failed for memory,
// only delayed; a new session whose first prompt finds no room is refused with "context memory
// exhausted", untouched.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/cache/kv_pool.h"
#include "engine/cache/sequence_state.h"
#include "engine/capacity.h"
#include "engine/config.h"
#include "engine/cpu/thread_pool.h"
#include "engine/models/qwen35.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "engine/status.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/quantized_weights.h"
#include "engine/weights/tensor_names.h"

namespace kiln::engine {

struct EngineOptions {
  int threads = 0;                             // 0: all hardware threads
  int64_t kv_budget_bytes = int64_t(1) << 30;  // KV pages + the sessions' fixed GDN state
  int max_sessions = 16;
  CacheDtype cache_dtype = CacheDtype::f32;    // f32: exact; bf16: the released models' dtype, 2× tokens
  int64_t page_tokens = 16;
  // Weight storage (engine/weights/quantized_weights.h): nullopt keeps the checkpoint's dtype
  // (exact; what `kiln engine logits` and the golden tests use); bf16/q8/q4 convert the large
  // matrices at load and cache them next to the model.
  std::optional<cpu::WeightFormat> weights;
  bool quantize_lm_head = true;
  bool weight_cache = true;
  bool progress = false;  // progress bar on stderr while quantizing
  // Prefill tokens per scheduler step: a longer prompt is cut into chunks of this many tokens so
  // that decoding sessions wait at most one chunk per step.
  int64_t prefill_chunk = 512;
  // The longest speculative draft the capacity plan reserves for (GenerateOptions::speculative
  // sets the drafts themselves): each session's verification scratch at this length is taken out
  // of kv_budget_bytes like its GDN state (capacity.h). A longer draft still runs, its extra
  // scratch outside the plan; the server sets this from the model's draft_tokens.
  int max_draft_tokens = 0;
};

struct OpenOptions {
  int priority = 0;  // higher: admitted first, and prefilled first
  // Called on the waiting thread (not under a lock) with the 1-based position in line, each
  // time it changes, while every session slot is taken.
  std::function<void(int64_t position)> on_wait;
  const std::atomic<bool>* cancel = nullptr;  // checked every 100 ms while waiting
  std::function<bool()> cancelled;            // also checked every 100 ms (e.g. the build was cancelled)
};

class Session;

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& dir, const EngineOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const CapacityPlan& plan() const { return plan_; }
  const EngineOptions& options() const { return options_; }
  const std::string& dir() const { return dir_; }
  const Qwen35Model& network() const { return *network_; }
  KvPool& kv_pool() const { return *kv_pool_; }
  // The converted weights' storage; nullptr when the weights are used as stored.
  const StoredWeights* stored_weights() const { return stored_.get(); }
  ThreadPool& thread_pool() const { return *pool_; }

  // A new empty session, without waiting: fails when max_sessions are open or others wait.
  Result<std::unique_ptr<Session>> open_session(int priority = 0);
  // A new empty session, waiting in line (priority, then arrival) for a free slot.
  Result<std::unique_ptr<Session>> open_session_waiting(const OpenOptions& options);
  int open_sessions() const;
  int waiting_sessions() const;
  Scheduler& scheduler() const { return *scheduler_; }
  // Idle sessions whose KV pages were taken for another session's call.
  int64_t kv_reclaims() const { return kv_reclaims_.load(); }
  // Sessions inside a call whose KV pages were taken for a higher-ranked one.
  int64_t kv_preemptions() const { return scheduler_->preemptions(); }
  // Calls that waited for KV memory because nothing could be taken for them.
  int64_t kv_waits() const { return scheduler_->kv_waits(); }
  // New sessions' first calls refused for KV memory (the agent retries them).
  int64_t kv_refusals() const { return scheduler_->kv_refusals(); }

 private:
  friend class Session;
  friend struct SessionCall;
  Model() = default;
  static Result<std::unique_ptr<Model>> load_checked(const std::string& dir, const EngineOptions& options);
  // For the scheduler: the KV pages held by sessions not inside a call, and freeing those of the
  // least recently used one (false when there is none).
  int64_t idle_kv_pages();
  bool reclaim_idle_kv();
  std::string dir_;
  EngineOptions options_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  ModelWeights weights_;
  CapacityPlan plan_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<StoredWeights> stored_;  // declared after checkpoint_: views may point into either
  std::unique_ptr<KvPool> kv_pool_;
  std::unique_ptr<Qwen35Model> network_;
  std::unique_ptr<Scheduler> scheduler_;  // after network_: destroyed (joined) first

  struct Waiter {
    int priority = 0;
    uint64_t arrival = 0;
  };
  void close_slot();
  int64_t position(const Waiter& w) const;  // REQUIRES(admission_mu_)
  mutable std::mutex admission_mu_;
  std::condition_variable admission_cv_;
  int open_ = 0;                   // GUARDED_BY(admission_mu_)
  uint64_t arrivals_ = 0;          // GUARDED_BY(admission_mu_)
  std::vector<Waiter*> waiters_;   // GUARDED_BY(admission_mu_)

  // Every open session, for reclaiming idle KV. Lock order: sessions_mu_, then a session's
  // call_mu_ (try_lock only, so never waiting while holding sessions_mu_).
  std::mutex sessions_mu_;
  std::vector<Session*> sessions_;  // GUARDED_BY(sessions_mu_)
  std::atomic<int64_t> kv_reclaims_{0};
  std::atomic<uint64_t> session_order_{0};
};

// A saved point in a session: its length and its GDN states (KV needs nothing: positions past the
// checkpoint are dropped on rewind). Costs one copy of the GDN state (§4.1).
struct SessionCheckpoint {
  std::vector<int32_t> tokens;
  std::vector<DeltaNetState> gdn;
  std::vector<float> last_logits;
};

// One sequence. State list:
//   empty      — after Model::open_session(); no tokens, no logits
//   ready      — append() / generate() / rewind() leave it here, with last_logits() valid
// Every mutating call either succeeds fully or changes nothing (errors are returned before any
// cache is touched).
class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Prefills `tokens` after the history. Returns logits of the last position ([V]), or of every
  // new position ([T][V]) when all_logits. Errors: bad token id, context longer than
  // max_position_embeddings, "context memory exhausted". With `cancel`, setting it stops the
  // prefill between chunks with an error: the exception to "changes nothing" — the chunks that
  // ran stay in the history, and last_logits() is empty until the next append() or rewind().
  Result<std::vector<float>> append(std::span<const int32_t> tokens, bool all_logits = false,
                                    const std::atomic<bool>* cancel = nullptr);

  // Samples up to max_tokens from the last logits, appending each sampled token (so afterwards the
  // history holds them all and last_logits() follows the final one). on_token returns false to stop;
  // it runs on this thread and must not call into this session. KV for all max_tokens is reserved
  // up front when the pool has room (else per token), and what is unused is given back.
  Result<GenerateResult> generate(const GenerateOptions& options, const std::function<bool(int32_t)>& on_token = {});

  SessionCheckpoint checkpoint() const;
  // Back to a checkpoint taken from this session whose tokens are still a prefix of the history.
  Status rewind(const SessionCheckpoint& checkpoint);

  const std::vector<int32_t>& tokens() const { return seq_.tokens; }
  std::span<const float> last_logits() const { return seq_.last_logits; }
  int64_t size() const { return int64_t(seq_.tokens.size()); }
  int priority() const { return seq_.priority; }
  // Tokens re-prefilled because this session's KV pages were taken (while idle, or preempted).
  int64_t rebuilt_tokens() const { return seq_.rebuilt_tokens; }
  // The last append failed only because running sessions held the KV memory (a new session is
  // refused then, untouched): the same call can succeed once they give pages back.
  bool refused_for_memory() const { return seq_.refused_for_memory; }

 private:
  friend class Model;
  friend struct SessionCall;
  Session(Model& model, int priority);
  // After an idle reclaim: its GDN state is reset so that the scheduler re-runs the whole history
  // (positions [0, size())) before the next call's work.
  void restart_history();
  Model& model_;
  // Held for the whole of each call, so that reclaiming (by the scheduler thread, with try_lock)
  // never touches a session in use.
  mutable std::mutex call_mu_;
  std::atomic<int64_t> last_used_ns_{0};
  bool reclaimed_ = false;  // GUARDED_BY(call_mu_): KV pages taken while idle; restart_history() before use
  Sequence seq_;  // the scheduler's while a call of this session is queued
};

}  // namespace kiln::engine
