// The Split pre-tokenizer: a regex from tokenizer.json, compiled with PCRE2 (UTF + UCP, JIT).
// Hugging Face files use Oniguruma syntax; translate_pattern() rewrites the few constructs whose
// meaning differs in PCRE2 (see pretokenizer.cpp). Behaviour "Isolated": every match is a piece
// and so is every stretch of text between matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::engine {

class SplitRegex {
 public:
  // Returns nullptr and sets `error` when PCRE2 rejects the pattern.
  static std::unique_ptr<SplitRegex> compile(const std::string& pattern, std::string& error);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Calls on_piece(begin, end) for each piece of `text`, which must be valid UTF-8.
  template <typename F>
  void split(std::string_view text, F&& on_piece) const {
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    split_into(text, pieces);
    for (auto [b, e] : pieces) on_piece(b, e);
  }
  void split_into(std::string_view text,
                  std::vector<std::pair<std::size_t, std::size_t>>& pieces) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& translated() const { return translated_; }

 private:
  SplitRegex() = default;
  struct Code;
  std::unique_ptr<Code> code_;
  std::string pattern_;
  std::string translated_;
};

// Oniguruma → PCRE2: `\s` also matches U+0085 (NEL) as in Oniguruma's Unicode \s.
std::string translate_pattern(std::string_view onig_pattern);

}  // namespace kiln::engine
