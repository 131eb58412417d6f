#include "engine/tokenizer/tiny_tokenizer.h"

#include <fstream>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/byte_level.h"

namespace kiln::engine {

namespace {

const char kMerges[] =
#include "engine/assets/tiny-tokenizer/qwen3_merges_32512.inc"
    ;

const char kTemplate[] =
#include "engine/assets/tiny-tokenizer/qwen3.6_chat_template.inc"
    ;

// The Qwen3.5/3.6 added tokens in their order (model-spec §6) and whether decode may skip them.
struct Special {
  const char* content;
  bool special;
};
constexpr Special kAdded[] = {
    {"<|endoftext|>", true},      {"<|im_start|>", true},        {"<|im_end|>", true},
    {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true},        {"<|quad_start|>", true},      {"<|quad_end|>", true},
    {"<|vision_start|>", true},   {"<|vision_end|>", true},      {"<|vision_pad|>", true},
    {"<|image_pad|>", true},      {"<|video_pad|>", true},       {"<tool_call>", false},
    {"</tool_call>", false},      {"<|fim_prefix|>", false},     {"<|fim_middle|>", false},
    {"<|fim_suffix|>", false},    {"<|fim_pad|>", false},        {"<|repo_name|>", false},
    {"<|file_sep|>", false},      {"<tool_response>", false},    {"</tool_response>", false},
    {"<think>", false},           {"</think>", false},           {"<|audio_start|>", true},
    {"<|audio_end|>", true},      {"<tts_pad>", true},           {"<tts_text_bos>", true},
    {"<tts_text_eod>", true},     {"<tts_text_bos_single>", true}, {"<|audio_pad|>", true},
};
constexpr std::size_t kNumAdded = sizeof(kAdded) / sizeof(kAdded[0]);

// The Qwen3.5/3.6 split regex (letters joined with combining marks), model-spec §6.
constexpr const char* kPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::vector<std::pair<std::string_view, std::string_view>> stored_merges() {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  std::string_view all(kMerges);
  while (!all.empty()) {
    const std::size_t nl = all.find('\n');
    const std::string_view line = all.substr(0, nl);
    const std::size_t sp = line.find(' ');
    out.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    if (nl == std::string_view::npos) break;
    all.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace

const char* qwen36_chat_template_text() { return kTemplate; }

TinyTokenizerFiles make_tiny_tokenizer(std::size_t vocab_size) {
  using nlohmann::ordered_json;
  TinyTokenizerFiles files;
  TinyTokenizerInfo& info = files.info;
  const auto merges = stored_merges();
  const std::size_t max_vocab = std::min(kTinyTokenizerMaxVocab, 256 + merges.size() + kNumAdded);
  if (vocab_size < kTinyTokenizerMinVocab || vocab_size > max_vocab) {
    info.error = "tiny tokenizer vocab size " + std::to_string(vocab_size) + " is outside " +
                 std::to_string(kTinyTokenizerMinVocab) + ".." + std::to_string(max_vocab);
    return files;
  }
  const std::size_t n_merges = vocab_size - 256 - kNumAdded;
  const auto first_added = static_cast<TokenId>(vocab_size - kNumAdded);

  // The vocab object is written by hand: ordered_json inserts are linear in the object size.
  std::string vocab = "{";
  auto add_vocab = [&](const std::string& token, std::size_t id) {
    if (vocab.size() > 1) vocab += ", ";
    vocab += ordered_json(token).dump();
    vocab += ": " + std::to_string(id);
  };
  for (std::size_t i = 0; i < 256; ++i) add_vocab(byte_level::char_of_byte(byte_level::byte_order()[i]), i);
  ordered_json merge_list = ordered_json::array();
  for (std::size_t i = 0; i < n_merges; ++i) {
    const auto& [l, r] = merges[i];
    add_vocab(std::string(l) + std::string(r), 256 + i);
    merge_list.push_back(ordered_json::array({std::string(l), std::string(r)}));
  }
  vocab += "}";
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  for (std::size_t i = 0; i < kNumAdded; ++i) {
    const auto id = first_added + static_cast<TokenId>(i);
    added.push_back({{"id", id}, {"content", kAdded[i].content}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", kAdded[i].special}});
    added_decoder[std::to_string(id)] = {{"content", kAdded[i].content}, {"lstrip", false},
                                         {"normalized", false}, {"rstrip", false},
                                         {"single_word", false}, {"special", kAdded[i].special}};
  }
  const ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                   {"trim_offsets", false}, {"use_regex", false}};
  ordered_json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kPattern}}}, {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", "@VOCAB@"},
        {"merges", merge_list}}}};
  ordered_json config = {{"add_bos_token", false},
                         {"add_prefix_space", false},
                         {"added_tokens_decoder", added_decoder},
                         {"bos_token", nullptr},
                         {"chat_template", kTemplate},
                         {"clean_up_tokenization_spaces", false},
                         {"eos_token", "<|im_end|>"},
                         {"errors", "replace"},
                         {"model_max_length", 262144},
                         {"pad_token", "<|endoftext|>"},
                         {"split_special_tokens", false},
                         {"tokenizer_class", "Qwen2Tokenizer"},
                         {"unk_token", nullptr}};
  files.tokenizer_json = tok.dump(2);
  files.tokenizer_json.replace(files.tokenizer_json.find("\"@VOCAB@\""), 9, vocab);
  files.tokenizer_config_json = config.dump(2);
  info.vocab_size = vocab_size;
  info.endoftext = first_added;
  info.im_start = first_added + 1;
  info.im_end = first_added + 2;
  return files;
}

TinyTokenizerInfo write_tiny_tokenizer(const std::string& model_dir, std::size_t vocab_size) {
  TinyTokenizerFiles files = make_tiny_tokenizer(vocab_size);
  if (!files.info.ok()) return files.info;
  for (const auto& [name, text] : {std::pair<const char*, const std::string*>{"tokenizer.json", &files.tokenizer_json},
                                   {"tokenizer_config.json", &files.tokenizer_config_json}}) {
    const std::string path = model_dir + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << *text;
    out.close();
    if (!out) {
      files.info.error = path + ": cannot write";
      return files.info;
    }
  }
  return files.info;
}

}  // namespace kiln::engine
