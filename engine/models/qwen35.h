// The Qwen3.5/3.6 hybrid family (qwen3_5_moe and qwen3_5): one forward pass for both; the FFN
// (MoE or dense SwiGLU) is chosen from the config. Reads like the HF modeling file.
//
// A forward pass is a *batch* of sequence steps (forward_batch): each sequence brings T_i new
// tokens and its own SequenceState. Row-wise work (norms, every projection, the router, experts,
// lm_head) runs once over the concatenated rows, so each weight is read once per step for all
// sequences; RoPE positions, the KV cache, the conv window and the gated delta rule run per
// sequence on its own state (T_i = 1, or a sequential step: the decode form a position at a time,
// recurrent GDN and paged attention; else the chunked form). A sequence's
// results do not depend on what it is batched with: every kernel computes a row (or a head of one
// sequence) the same way whatever the other rows are, so batched logits equal solo ones bitwise.
//
// Thread safety: const after construction. forward_batch may run concurrently on disjoint
// sequences (the ThreadPool serialises parallel sections), but in a Model only the scheduler
// thread (engine/scheduler.h) calls it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/cache/sequence_state.h"
#include "engine/config.h"
#include "engine/cpu/thread_pool.h"
#include "engine/weights/tensor_names.h"

namespace kiln::engine {

namespace ops {
struct GdnDecodeArgs;
}

enum class LogitRows { none, last, all };

// What a verification step (SeqStep::sequential) records so that its GDN states can be rolled
// back to the end of any of its positions: the states at its start and, for every position but
// the last, each linear layer's GDN inputs (the in_proj rows: conv_dim + value_dim + 2·Hv floats).
// A rollback replays the decode step over the kept positions — the same op on the same inputs,
// so the same bits as the states a plain decode reached. It costs one state copy per step and
// the replay of the kept positions when a draft is cut; a copy of every layer's state after every
// position cost T−1 states of memory and traffic (8 × 63 MB a session for the 35B-A3B at draft
// length 8).
struct GdnRollback {
  std::vector<DeltaNetState> before;  // [n_linear] the states when the step began
  std::vector<float> inputs;          // [position][n_linear][qkv | z | b | a]
  int64_t positions = 0;              // positions recorded: T − 1
};

// One sequence's part of a batched step.
struct SeqStep {
  const int32_t* tokens = nullptr;  // T ids at positions state->n_past ..
  int64_t T = 0;
  SequenceState* state = nullptr;   // KV for the T positions must be reserved
  LogitRows logits = LogitRows::last;
  float* out = nullptr;             // [T][V] (all) or [V] (last); unused for none
  // Verifying a speculative draft: the T tokens run one after another in the decode form (paged
  // attention, recurrent GDN step), so every position's logits equal those of a plain decode step
  // bit for bit. gdn_rollback, when set, records what Qwen35Model::roll_back_gdn needs to return
  // the GDN states to the end of any position but the last (buffers grown as needed, then reused).
  bool sequential = false;
  GdnRollback* gdn_rollback = nullptr;
};

// What one step did, for the batch bench.
struct StepStats {
  int64_t rows = 0;          // tokens in the step
  int64_t moe_layers = 0;    // MoE layers run
  int64_t experts_read = 0;  // distinct routed experts read, summed over MoE layers
};

class Qwen35Model {
 public:
  Qwen35Model(const ModelConfig& config, const ModelWeights& weights, ThreadPool* pool)
      : c_(config), w_(weights), pool_(pool) {}

  // Runs every sequence's tokens, updates their GDN states and KV, advances each n_past by T,
  // and writes the requested logits. Cannot fail: callers validate ids and reserve KV first.
  void forward_batch(std::span<const SeqStep> seqs, StepStats* stats = nullptr) const;

  // One sequence: forward_batch of one step; logits [T][V] (all_logits) or [V].
  void forward(const int32_t* tokens, int64_t T, SequenceState& st, bool all_logits, float* logits) const;

  // Allocates zeroed GDN state for a new sequence.
  void init_state(SequenceState& st) const;

  // Sets st's GDN states to those after the first `positions` (1 .. rb.positions) positions of
  // the verification step rb recorded (its KV and n_past are the caller's). pool: where the
  // replay runs (nullptr: on the calling thread; only the scheduler thread may pass the pool).
  void roll_back_gdn(const GdnRollback& rb, int64_t positions, SequenceState& st, ThreadPool* pool) const;
  ThreadPool* pool() const { return pool_; }  // the forward passes' (scheduler thread only)

 private:
  struct Rows;  // row offsets of the sequences in the concatenated batch
  void attention_block(const AttentionWeights& w, int layer_slot, const float* a, const Rows& rows,
                       float* out) const;
  void delta_net_block(const DeltaNetWeights& w, int linear_index, const float* a, const Rows& rows,
                       float* out) const;
  void mlp_block(const MlpWeights& w, const float* a, int64_t T, float* out) const;
  ops::GdnDecodeArgs gdn_decode_args(const DeltaNetWeights& w, const float* qkv, const float* z, const float* b,
                                     const float* a, DeltaNetState& st, CacheDtype dtype, float* out) const;
  void moe_block(const MoeWeights& w, const float* a, int64_t T, float* out, StepStats* stats) const;

  const ModelConfig& c_;
  const ModelWeights& w_;
  ThreadPool* pool_;
};

}  // namespace kiln::engine
