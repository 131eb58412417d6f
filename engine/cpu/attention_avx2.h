// Attention on AVX2 + FMA (attention_avx2.cpp): the kernels of ops::attention (prefill) and
// ops::attention_paged (decode) for head sizes that are a multiple of 16 (every model of the
// family: 256). Call only when cpu_features().has_avx2_set().
#pragma once

#include <cstdint>

#include "engine/ops.h"

namespace kiln::engine::cpu::avx2 {

// Causal GQA attention, the layout of ops::attention: q[T][Hq][D]; k, v[n_kv][Hkv][D] hold
// positions 0..n_kv−1 and query t sits at position n_kv − T + t.
struct PrefillAttention {
  const float *q, *k, *v;
  int64_t T, n_kv;
  int Hq, Hkv, D;
  float scale;
  float* out;  // [T][Hq][D]
};

inline bool tiled_attention_supports(int head_dim) { return head_dim > 0 && head_dim % 16 == 0; }

// Query tokens per prefill_attention_block call for a GQA group size: about 96 rows (tokens ×
// group), so every key and value row loaded serves many FMAs. kernels_bench, one thread,
// 512 queries over 4,096 keys: 12 rows gave 34 GFLOP/s, 24 gave 42-44, 36 gave 50-56, 64 gave
// 52-55, 96 gave 57-60 and 128 gave 55-58.
inline int64_t prefill_query_tokens(int group) {
  constexpr int64_t kRows = 96;
  return kRows / group > 0 ? kRows / group : 1;
}

// Writes the outputs of query tokens [t0, t0 + nt) for the query heads of KV head `kv_head`.
void prefill_attention_block(const PrefillAttention& a, int kv_head, int64_t t0, int64_t nt);

// One split of flash-decoding for one token: its Hkv·group query rows q[Hkv·group][D] against
// keys [k_begin, k_end) of the paged cache, k_begin on a page boundary. Every KV head at once, so
// each page's K and V rows are read as one contiguous block. Leaves each row's unnormalised
// softmax state at part + kh·kh_stride + g·(D + 2): acc[D], then the running max m and sum l
// (l = 0: no key). ops::attention_paged merges the splits.
void paged_attention_split(const float* q, const ops::PagedKv& kv, int Hkv, int group, int D, float scale,
                           int64_t k_begin, int64_t k_end, float* part, int64_t kh_stride);

}  // namespace kiln::engine::cpu::avx2
