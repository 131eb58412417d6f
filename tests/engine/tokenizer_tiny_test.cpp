// The tiny tokenizer written into make-tiny model directories.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/chat/chat_template.h"
#include "engine/tokenizer/tiny_tokenizer.h"
#include "tests/engine/tokenizer_test_fixtures.h"

namespace kiln::engine {
namespace {

std::unique_ptr<Tokenizer> load_tiny(std::size_t n, TinyTokenizerInfo& info) {
  TinyTokenizerFiles files = make_tiny_tokenizer(n);
  info = files.info;
  EXPECT_TRUE(info.ok()) << info.error;
  TokenizerLoad load = Tokenizer::load_json_text(files.tokenizer_json, files.tokenizer_config_json, "tiny");
  EXPECT_TRUE(load.ok()) << load.error;
  return std::move(load.tokenizer);
}

class TinyTokenizerSizes : public ::testing::TestWithParam<std::size_t> {};

TEST_P(TinyTokenizerSizes, LoadsWithSpecialTokensAtTheTop) {
  const std::size_t n = GetParam();
  TinyTokenizerInfo info;
  auto tok = load_tiny(n, info);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), n);
  EXPECT_EQ(info.endoftext, static_cast<TokenId>(n - 33));
  EXPECT_EQ(tok->token_id("<|endoftext|>"), info.endoftext);
  EXPECT_EQ(tok->token_id("<|im_start|>"), info.im_start);
  EXPECT_EQ(tok->token_id("<|im_end|>"), info.im_end);
  EXPECT_EQ(tok->eos_token_id(), info.im_end);
  EXPECT_EQ(tok->token_id("<|audio_pad|>"), static_cast<TokenId>(n - 1));
  EXPECT_FALSE(tok->is_special(*tok->token_id("<think>")));
  EXPECT_EQ(detect_flavor(tok->chat_template()), TemplateFlavor::qwen3_6);
  EXPECT_FALSE(tok->normalizes_nfc());
  // Every id below the added tokens is a real token.
  for (std::size_t id = 0; id < n - 33; ++id) ASSERT_FALSE(tok->token_bytes(static_cast<TokenId>(id)).empty());

  const std::string prompt = "<|im_start|>user\nHello, wörld! def f(x): return x * 2<|im_end|>\n<|im_start|>assistant\n<think>\n";
  const auto ids = tok->encode(prompt);
  EXPECT_EQ(ids.front(), info.im_start);
  EXPECT_EQ(ids.back() == *tok->token_id("\n") || ids.back() == info.im_start, true);
  EXPECT_EQ(tok->decode(ids), prompt);
  for (TokenId id : ids) EXPECT_LT(static_cast<std::size_t>(id), n);
  std::mt19937 rng(static_cast<unsigned>(n));
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0; k < 50; ++k) s.push_back(static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng)));
    ASSERT_EQ(tok->decode_bytes(tok->encode(s)), s);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TinyTokenizerSizes, ::testing::Values(512, 2048, 32768));

TEST(TinyTokenizer, IsAPrefixOfTheRealQwenVocabulary) {
  TinyTokenizerInfo info;
  auto tiny = load_tiny(32768, info);
  const Tokenizer& full = testing::qwen35_regex_tokenizer();  // same regex, no normaliser
  const auto cut = static_cast<TokenId>(32768 - 33);
  for (TokenId id = 0; id < cut; ++id) ASSERT_EQ(tiny->token_bytes(id), full.token_bytes(id)) << id;
  // BPE with a prefix of the merges gives the same ids whenever the full result needs none of
  // the dropped merges.
  int same = 0;
  for (const char* text : {"The quick brown fox jumps over the lazy dog.", "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
                           "def main():\n    print(\"hello world\")\n", "Il était une fois", "return nullptr;"}) {
    const auto f = full.encode(text);
    bool below = true;
    for (TokenId id : f) below = below && id < cut;
    if (!below) continue;
    EXPECT_EQ(tiny->encode(text), f) << text;
    ++same;
  }
  EXPECT_GE(same, 3);
}

TEST(TinyTokenizer, WritesAModelDirectoryAndRejectsBadSizes) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kiln-tiny-tok-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const TinyTokenizerInfo info = write_tiny_tokenizer(dir.string(), 2048);
  ASSERT_TRUE(info.ok()) << info.error;
  TokenizerLoad load = Tokenizer::load_model_dir(dir.string());
  ASSERT_TRUE(load.ok()) << load.error;
  EXPECT_EQ(load.tokenizer->vocab_size(), 2048u);
  EXPECT_EQ(load.tokenizer->eos_token_id(), info.im_end);
  // A template in chat_template.jinja is used when tokenizer_config.json has none.
  std::ofstream(dir / "tokenizer_config.json") << "{}";
  std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
  TokenizerLoad with_jinja = Tokenizer::load_model_dir(dir.string());
  ASSERT_TRUE(with_jinja.ok()) << with_jinja.error;
  EXPECT_EQ(with_jinja.tokenizer->chat_template(), "{{ messages }}");
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(make_tiny_tokenizer(100).info.ok());
  EXPECT_FALSE(make_tiny_tokenizer(1 << 20).info.ok());
  const TinyTokenizerInfo bad = write_tiny_tokenizer("/nonexistent-dir-kiln", 1024);
  EXPECT_NE(bad.error.find("/nonexistent-dir-kiln/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace kiln::engine
