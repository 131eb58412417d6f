// Shared fixtures of the tokenizer/chat tests: the real Qwen3 tokenizer from ../shared (loaded
// once per test binary) and a variant with the Qwen3.5 split regex and no normaliser, which is
// what llama.cpp's qwen35 vocab test pairs with the same 151k vocabulary.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"

namespace kiln::engine::testing {

inline std::string shared_path(const std::string& rel) { return std::string(KILN_SHARED_DIR) + "/" + rel; }

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const std::string& qwen3_json_text() {
  static const std::string text = [] {
    std::string out, error;
    EXPECT_TRUE(read_text_file(shared_path("assets/tokenizers/qwen3/tokenizer.json.gz"), out, error))
        << error;
    return out;
  }();
  return text;
}

inline const Tokenizer& qwen3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    TokenizerLoad load = Tokenizer::load_json_text(
        qwen3_json_text(), read_all(shared_path("assets/tokenizers/qwen3/tokenizer_config.json")),
        "qwen3/tokenizer.json");
    EXPECT_TRUE(load.ok()) << load.error;
    return std::move(load.tokenizer);
  }();
  return *tok;
}

inline constexpr const char* kQwen35Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Qwen3 vocab + merges, Qwen3.5 regex, no normaliser (edited as JSON, then loaded from text).
inline const Tokenizer& qwen35_regex_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    nlohmann::json j = nlohmann::json::parse(qwen3_json_text());
    j["normalizer"] = nullptr;
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen35Pattern;
    TokenizerLoad load = Tokenizer::load_json_text(j.dump(), {}, "qwen3+qwen35-regex");
    EXPECT_TRUE(load.ok()) << load.error;
    return std::move(load.tokenizer);
  }();
  return *tok;
}

}  // namespace kiln::engine::testing
