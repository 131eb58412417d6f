// The tensor-name table: which checkpoint tensor plays which role, with the shape the config
// implies (model-spec §2). bind_weights() claims every tensor the text model needs, checks dtype
// and shape, and reports missing, mis-shaped or unsupported tensors by name and file. Vision
// (`model.visual.*`) and MTP (`mtp.*`) tensors are known and skipped; any other tensor nobody
// claims becomes a warning. Matrices stay views into the mmap; only 1-D vectors (norms, gates,
// conv taps) are widened to f32 copies, which are tiny.
#pragma once

#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/ops.h"
#include "engine/weights/safetensors.h"

namespace kiln::engine {

struct AttentionWeights {
  Matrix q_proj, k_proj, v_proj, o_proj;  // q_proj rows: per head [q(D) | gate(D)]
  std::vector<float> q_norm, k_norm;      // zero-centred
};

struct DeltaNetWeights {
  Matrix in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  std::vector<float> conv1d;          // [conv_dim][K]
  std::vector<float> conv1d_taps;     // [K][conv_dim]: the same, tap-major, so decode reads channels in order
  std::vector<float> A_log, dt_bias;  // [Hv]
  std::vector<float> norm;            // [dv], applied as stored
};

struct MlpWeights {
  Matrix gate_proj, up_proj, down_proj;
};

struct MoeWeights {
  Matrix router;                    // mlp.gate.weight [E][H]
  std::vector<MlpWeights> experts;  // packed or per-expert, as views
  bool has_shared_expert = false;
  MlpWeights shared_expert;
  Matrix shared_expert_gate;  // [1][H]
};

struct LayerWeights {
  LayerType type = LayerType::linear_attention;
  std::vector<float> input_layernorm, post_attention_layernorm;
  AttentionWeights attn;  // full-attention layers
  DeltaNetWeights gdn;    // linear-attention layers
  MlpWeights mlp;         // dense models
  MoeWeights moe;         // MoE models
};

struct ModelWeights {
  Matrix embed_tokens, lm_head;
  std::vector<float> norm;
  std::vector<LayerWeights> layers;
  int64_t n_params = 0;         // text-model parameters bound (embedding and lm_head included)
  int64_t n_params_active = 0;  // per token: all but the unselected experts; one embedding row
  int64_t n_bytes = 0;          // stored bytes of the bound tensors
  int64_t n_bytes_active = 0;   // bytes read per token, counted like n_params_active
  std::vector<std::string> warnings;  // unclaimed tensors
};

Result<ModelWeights> bind_weights(const ModelConfig& config, const Checkpoint& checkpoint, const std::string& dir);

}  // namespace kiln::engine
