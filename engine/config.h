// ModelConfig: the language-model fields of a Qwen3.5/3.6 `config.json`, named as in the file.
// Reads `text_config` when present, else the top level (model-spec §1.1). Every field is checked;
// a bad value is reported as "config.json: <field> = <value>: <why>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/status.h"

namespace kiln::engine {

enum class LayerType { linear_attention, full_attention };

struct ModelConfig {
  std::string model_type;  // "qwen3_5_moe" or "qwen3_5" (the wrapper's, or the text one's)
  bool is_moe = false;     // MoE FFN in every layer (qwen3_5_moe) vs dense SwiGLU MLP (qwen3_5)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_hidden_layers = 0;
  std::vector<LayerType> layer_types;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;  // -1: none

  // Gated full attention.
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 256;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor, even

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;

  // FFN.
  int64_t intermediate_size = 0;  // dense MLP
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;             // 0: absent, read from the expert tensors
  int64_t shared_expert_intermediate_size = 0;   // −1: absent, read from the tensors; 0: none

  std::string dtype = "bfloat16";  // the checkpoint's dtype as the config states it

  // Derived sizes (model-spec §1.2).
  int n_full_layers() const;
  int n_linear_layers() const;
  int64_t q_proj_rows() const { return int64_t(num_attention_heads) * head_dim * 2; }
  int64_t kv_dim() const { return int64_t(num_key_value_heads) * head_dim; }
  int64_t key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // A linear layer's decode-step inputs for one position (the in_proj rows qkv | z | b | a), in
  // floats: what a speculative verification records per position to roll back by replay.
  int64_t gdn_input_floats() const { return conv_dim() + value_dim() + 2 * int64_t(linear_num_value_heads); }
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& path);
// Adds generation_config.json's eos_token_id (an int or a list) to c.eos_token_ids when the file
// exists: the released checkpoints list <|im_end|>, the end of a chat turn, only there.
Status merge_generation_config(ModelConfig& c, const std::string& path);

}  // namespace kiln::engine
