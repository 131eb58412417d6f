// Prefill attention on AVX2 + FMA (attention_avx2.cpp): ops::attention's kernel for head sizes
// that are a multiple of 16 (every model of the family: 256). Call only when
// cpu_features().has_avx2_set().
#pragma once

#include <cstdint>

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

inline bool prefill_attention_supports(int head_dim) { return head_dim > 0 && head_dim % 16 == 0; }

// Writes the outputs of query tokens [t0, t0 + nt) for the query heads of KV head `kv_head`.
void prefill_attention_block(const PrefillAttention& a, int kv_head, int64_t t0, int64_t nt);

}  // namespace kiln::engine::cpu::avx2
