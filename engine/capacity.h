// Capacity planning (model-spec §4): from a KV byte budget, the number of sessions and the layer
// layout, how many tokens of KV fit and how many full-length sessions that is. Each session has a
// fixed GDN state (conv window in the cache dtype + f32 recurrent state per linear layer); the
// rest of the budget is KV pages of `page_tokens` tokens for all full-attention layers. Sessions
// that verify speculative drafts of up to `draft_tokens` tokens also hold, while they generate,
// the verification's scratch (engine/models/qwen35.h GdnRollback and the draft's logits): it is
// planned as fixed state too.
#pragma once

#include <cstdint>
#include <string>

#include "engine/cache/kv_pool.h"
#include "engine/config.h"

namespace kiln::engine {

struct CapacityPlan {
  int64_t budget_bytes = 0;
  int max_sessions = 0;
  CacheDtype dtype = CacheDtype::bf16;
  int64_t kv_bytes_per_token = 0;       // all full-attention layers, K and V
  int64_t state_bytes_per_session = 0;  // all GDN layers: conv + recurrent
  int draft_tokens = 0;
  // A generating session's verification scratch at draft_tokens: the GDN states at the step's
  // start, each drafted position's GDN inputs and the step's rows of logits, twice (the
  // session's, and the batch's gathered copy) (0 without drafts).
  int64_t speculative_bytes_per_session = 0;
  int64_t page_tokens = 0;
  int64_t page_bytes = 0;
  int64_t pages = 0;                    // KV pages that fit after the sessions' fixed state
  int64_t kv_tokens = 0;                // pages × page_tokens
  int64_t max_position_embeddings = 0;
  int64_t full_length_sessions = 0;     // sessions of max_position_embeddings tokens that fit
  std::string to_text() const;          // human-readable, several lines
};

CapacityPlan plan_capacity(const ModelConfig& config, int64_t budget_bytes, int max_sessions, CacheDtype dtype,
                           int64_t page_tokens = 16, int draft_tokens = 0);

// The KV budget a model gets by default ("kv_budget": "auto"): room for every one of max_sessions
// sessions to hold tokens_per_session tokens of KV (whole pages) plus its fixed GDN state (and
// its speculative scratch at draft_tokens).
int64_t kv_budget_for(const ModelConfig& config, int max_sessions, CacheDtype dtype, int64_t tokens_per_session,
                      int64_t page_tokens = 16, int draft_tokens = 0);

// Memory this process may use: physical memory, or less where a cgroup (v2 memory.max, v1
// memory.limit_in_bytes) limits it. 0 when unknown.
int64_t usable_memory_bytes();

// The one parser of byte sizes users write (`--budget`, kv_budget, memory_budget, ...): a
// positive number with an optional unit, case-insensitive: B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB or K/M/G/T (powers of 1024): "36GiB", "512MiB", "1.5g", "2GB", "1000".
// Returns -1 for anything else: empty, zero, negative, NaN, an unknown unit, or 2^63 bytes or more.
int64_t parse_bytes(const std::string& text);

}  // namespace kiln::engine
