// The Qwen3.5/3.6 hybrid family (qwen3_5_moe and qwen3_5): one forward pass for both; the FFN
// (MoE or dense SwiGLU) is chosen from the config. Reads like the HF modeling file.
// Thread safety: const after construction; forward() may run concurrently for different
// sequences (the ThreadPool serialises their parallel sections).
#pragma once

#include <cstdint>

#include "engine/cache/sequence_state.h"
#include "engine/config.h"
#include "engine/cpu/thread_pool.h"
#include "engine/weights/tensor_names.h"

namespace kiln::engine {

class Qwen35Model {
 public:
  Qwen35Model(const ModelConfig& config, const ModelWeights& weights, ThreadPool* pool)
      : c_(config), w_(weights), pool_(pool) {}

  // Runs tokens[0..T) at positions st.n_past.. . KV for those positions must be reserved in
  // st.kv. Writes logits [T][V] (all_logits) or [1][V] (last position), updates the GDN
  // states and KV, and advances st.n_past by T. Cannot fail: callers validate first.
  void forward(const int32_t* tokens, int64_t T, SequenceState& st, bool all_logits, float* logits) const;

  // Allocates zeroed GDN state for a new sequence.
  void init_state(SequenceState& st) const;

 private:
  void attention_block(const AttentionWeights& w, int layer_slot, const float* a, int64_t T, SequenceState& st,
                       float* out) const;
  void delta_net_block(const DeltaNetWeights& w, const float* a, int64_t T, DeltaNetState& s, CacheDtype dtype,
                       float* out) const;
  void mlp_block(const MlpWeights& w, const float* a, int64_t T, float* out) const;
  void moe_block(const MoeWeights& w, const float* a, int64_t T, float* out) const;

  const ModelConfig& c_;
  const ModelWeights& w_;
  ThreadPool* pool_;
};

}  // namespace kiln::engine
