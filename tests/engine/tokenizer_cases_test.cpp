// The tokenizer against ids produced by third-party implementations (../shared/assets/tokenizers).
#include <gtest/gtest.h>

#include <sstream>

#include "tests/engine/tokenizer_test_fixtures.h"

namespace kiln::engine {
namespace {

using testing::qwen35_regex_tokenizer;
using testing::qwen3_tokenizer;
using testing::read_all;
using testing::shared_path;

std::vector<TokenId> parse_ids(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream in(line);
  TokenId id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// Splits a llama.cpp .inp file on "\n__ggml_vocab_test__\n" (the last piece is empty).
std::vector<std::string> read_inp(const std::string& path) {
  const std::string text = read_all(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t p = text.find(sep, pos);
    if (p == std::string::npos) break;
    out.push_back(text.substr(pos, p - pos));
    pos = p + sep.size();
  }
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_all(path));
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

TEST(TokenizerCases, Qwen3CasesJsonlEncodeAndDecode) {
  const Tokenizer& tok = qwen3_tokenizer();
  std::istringstream in(read_all(shared_path("assets/tokenizers/qwen3/cases.jsonl")));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    const auto expected = j["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok.encode(text), expected) << "text: " << text;
    // Decoding gives back the NFC form of the text.
    EXPECT_EQ(tok.decode(expected), tok.normalize(text)) << "text: " << text;
    ++n;
  }
  EXPECT_EQ(n, 20);
}

TEST(TokenizerCases, LlamaCppQwen2PairsWithQwen3Regex) {
  const Tokenizer& tok = qwen3_tokenizer();
  const auto inputs = read_inp(shared_path("assets/tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf.inp"));
  const auto outputs = read_lines(shared_path("assets/tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen2.gguf.out"));
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(outputs.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    EXPECT_EQ(tok.encode(inputs[i]), parse_ids(outputs[i])) << "case " << i << ": " << inputs[i];
}

TEST(TokenizerCases, LlamaCppQwen35PairsWithQwen35RegexAndNoNormalizer) {
  const Tokenizer& tok = qwen35_regex_tokenizer();
  const auto inputs = read_inp(shared_path("assets/tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen35.gguf.inp"));
  const auto outputs = read_lines(shared_path("assets/tokenizers/llama.cpp-vocab-tests/ggml-vocab-qwen35.gguf.out"));
  ASSERT_EQ(inputs.size(), 50u);
  ASSERT_EQ(outputs.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    EXPECT_EQ(tok.encode(inputs[i]), parse_ids(outputs[i])) << "case " << i << ": " << inputs[i];
}

TEST(TokenizerCases, CombiningMarksDependOnRegexAndNormalizer) {
  // e + U+0301: NFC composes it to é (Qwen3); the Qwen3.5 path keeps the mark inside the letter run.
  EXPECT_EQ(qwen3_tokenizer().encode("e\xCC\x81"), std::vector<TokenId>{963});
  EXPECT_EQ(qwen35_regex_tokenizer().encode("e\xCC\x81"), (std::vector<TokenId>{68, 53839}));
  // The Qwen3 regex (no \p{M}) splits a mark off its letter run; the Qwen3.5 regex keeps it.
  const auto q3 = qwen3_tokenizer().pre_tokenize("re\xCC\x81sume");
  const auto q35 = qwen35_regex_tokenizer().pre_tokenize("re\xCC\x81sume");
  EXPECT_EQ(q3, (std::vector<std::string>{"re", "\xCC\x81sume"}));
  EXPECT_EQ(q35, std::vector<std::string>{"re\xCC\x81sume"});
}

TEST(TokenizerCases, SplitPatternIsReadFromTheFile) {
  EXPECT_EQ(qwen3_tokenizer().split_pattern(),
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(qwen35_regex_tokenizer().split_pattern(), testing::kQwen35Pattern);
  EXPECT_TRUE(qwen3_tokenizer().normalizes_nfc());
  EXPECT_FALSE(qwen35_regex_tokenizer().normalizes_nfc());
}

TEST(TokenizerCases, AddedTokensAreMatchedAtomically) {
  const Tokenizer& tok = qwen3_tokenizer();
  EXPECT_EQ(tok.encode("<|im_start|>user\nHello<|im_end|>\n"),
            (std::vector<TokenId>{151644, 872, 198, 9707, 151645, 198}));
  EXPECT_EQ(tok.encode("<think>\n\n</think>\n\n"), (std::vector<TokenId>{151667, 271, 151668, 271}));
  EXPECT_EQ(tok.encode("a<tool_call>b"), (std::vector<TokenId>{64, 151657, 65}));
  // Without added-token matching the same text is ordinary BPE.
  EXPECT_GT(tok.encode_ordinary("<|im_end|>").size(), 1u);
  EXPECT_EQ(tok.decode(tok.encode_ordinary("<|im_end|>")), "<|im_end|>");
}

TEST(TokenizerCases, SpecialFlagsAndLookups) {
  const Tokenizer& tok = qwen3_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_id("Hello"), 9707);
  EXPECT_EQ(tok.token_id("\xC4\xA0the"), tok.token_id(" the"));  // "Ġthe" spelling and raw bytes
  EXPECT_FALSE(tok.token_id("no-such-token-xyz").has_value());
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is special:false: kept by skip_special decode
  EXPECT_EQ(tok.eos_token_id(), 151645);
  const std::vector<TokenId> ids{151644, 872, 198, 151667, 151645};
  EXPECT_EQ(tok.decode(ids, true), "user\n<think>");
  EXPECT_EQ(tok.decode(ids, false), "<|im_start|>user\n<think><|im_end|>");
  EXPECT_FALSE(tok.chat_template().empty());
}

}  // namespace
}  // namespace kiln::engine
