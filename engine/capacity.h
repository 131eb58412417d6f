// Capacity planning (model-spec §4): from a KV byte budget, the number of sessions and the layer
// layout, how many tokens of KV fit and how many full-length sessions that is. Each session has a
// fixed GDN state (conv window in the cache dtype + f32 recurrent state per linear layer); the
// rest of the budget is KV pages of `page_tokens` tokens for all full-attention layers.
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
  int64_t page_tokens = 0;
  int64_t page_bytes = 0;
  int64_t pages = 0;                    // KV pages that fit after the sessions' fixed state
  int64_t kv_tokens = 0;                // pages × page_tokens
  int64_t max_position_embeddings = 0;
  int64_t full_length_sessions = 0;     // sessions of max_position_embeddings tokens that fit
  std::string to_text() const;          // human-readable, several lines
};

CapacityPlan plan_capacity(const ModelConfig& config, int64_t budget_bytes, int max_sessions, CacheDtype dtype,
                           int64_t page_tokens = 16);

// Parses "36GiB", "512MiB", "2GB", "1000" (bytes). Returns -1 on a malformed value.
int64_t parse_bytes(const std::string& text);

}  // namespace kiln::engine
