// A small tokenizer of the Qwen kind for `make-tiny` models: the real Qwen3 byte-level BPE cut to
// its first merges (engine/assets/tiny-tokenizer/, compiled into the library), the Qwen3.5/3.6
// pre-tokenizer regex and no normaliser, and the 33 Qwen3.5/3.6 added tokens renumbered to the top
// of the vocabulary. Ids 0..255 are the bytes, 256.. the merges in rank order.
#pragma once

#include <cstddef>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace kiln::engine {

constexpr std::size_t kTinyTokenizerMinVocab = 512;
constexpr std::size_t kTinyTokenizerMaxVocab = 32768;

struct TinyTokenizerInfo {
  std::size_t vocab_size = 0;  // == requested size: ids 0..vocab_size-1 are all used
  TokenId endoftext = -1;      // <|endoftext|>: pad, second eos id
  TokenId im_start = -1;
  TokenId im_end = -1;         // eos_token of tokenizer_config.json
  std::string error;
  bool ok() const { return error.empty(); }
};

// The tokenizer.json and tokenizer_config.json (with the Qwen3.6 chat template) texts.
struct TinyTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  TinyTokenizerInfo info;
};
TinyTokenizerFiles make_tiny_tokenizer(std::size_t vocab_size);

// Writes both files into `model_dir` (which must exist). Error names the file or the size.
TinyTokenizerInfo write_tiny_tokenizer(const std::string& model_dir, std::size_t vocab_size);

// The official Qwen3.6 chat template text, as shipped with the model.
const char* qwen36_chat_template_text();

}  // namespace kiln::engine
