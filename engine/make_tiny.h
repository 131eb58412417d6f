// make_tiny: writes a random-weight Qwen3.5/3.6 model directory in exactly the released layout
// (config.json with text_config, safetensors with the real tensor names and the
// `model.language_model.` prefix, packed experts by default or per-expert), for tests, the demo
// model and benchmarks without downloading 70 GB. Weights are seeded by (seed, tensor name) and
// scaled so activations stay O(1): matrices have unit-variance outputs for unit-variance inputs,
// zero-centred norm weights are near 0, the GDN norm near 1, A_log = log(U[1,16]).
#pragma once

#include <cstdint>
#include <string>

#include "engine/status.h"
#include "engine/weights/safetensors.h"

namespace kiln::engine {

struct TinyModelOptions {
  bool moe = true;  // qwen3_5_moe; false: qwen3_5 (dense)
  uint64_t seed = 0;
  int layers = 4;
  int full_attention_interval = 4;
  int64_t hidden = 64;
  int heads = 4, kv_heads = 2, head_dim = 32;
  double partial_rotary_factor = 0.25;
  double rope_theta = 1e7;
  int linear_key_heads = 2, linear_value_heads = 4, linear_key_head_dim = 16, linear_value_head_dim = 16;
  int conv_kernel = 4;
  int experts = 8, top_k = 2;
  int64_t moe_intermediate = 32, shared_expert_intermediate = 32;
  int64_t intermediate = 128;  // dense MLP
  int64_t vocab = 512;
  int64_t max_position_embeddings = 4096;
  Dtype dtype = Dtype::bf16;  // bf16 or f32 (A_log is always f32, as released)
  bool per_expert = false;    // experts.{e}.{gate,up,down}_proj.weight instead of packed tensors
  int shards = 1;             // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json
  // Also write tokenizer.json + tokenizer_config.json (engine/tokenizer/tiny_tokenizer.h) when
  // vocab is within its range (512..32768), and take the config's eos ids from it.
  bool tokenizer = true;
};

// Writes (creating `dir` if needed) config.json and the safetensors files.
Status make_tiny_model(const std::string& dir, const TinyModelOptions& options);

}  // namespace kiln::engine
