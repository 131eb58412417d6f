// Everything a forward pass reads and writes for one sequence: its length, its KV pages and,
// per Gated DeltaNet layer, the conv window and the recurrent state (model-spec §4.1).
// Owned by one Session; only the model's forward pass mutates it.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/cache/kv_pool.h"
#include "engine/weights/safetensors.h"

namespace kiln::engine {

struct DeltaNetState {
  std::vector<uint8_t> conv;     // [K−1][conv_dim] pre-conv inputs, oldest first, in the cache dtype
  std::vector<float> recurrent;  // [Hv][dk][dv], always f32

  void load_conv(CacheDtype d, float* out) const {
    if (d == CacheDtype::f32) std::memcpy(out, conv.data(), conv.size());
    else to_f32(Dtype::bf16, conv.data(), out, int64_t(conv.size() / 2));
  }
  void store_conv(CacheDtype d, const float* in) {
    if (d == CacheDtype::f32) {
      std::memcpy(conv.data(), in, conv.size());
    } else {
      auto* p = reinterpret_cast<uint16_t*>(conv.data());
      for (size_t i = 0; i < conv.size() / 2; ++i) p[i] = f32_to_bf16(in[i]);
    }
  }
  bool operator==(const DeltaNetState&) const = default;
};

struct SequenceState {
  int64_t n_past = 0;  // positions already in the caches
  CacheDtype dtype = CacheDtype::f32;
  std::unique_ptr<SequenceKv> kv;
  std::vector<DeltaNetState> gdn;  // one per linear-attention layer, in layer order
};

}  // namespace kiln::engine
