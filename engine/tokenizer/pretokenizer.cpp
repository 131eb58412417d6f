#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kiln::engine {

// PCRE2 objects are immutable after JIT compilation and may be shared by threads; match data is
// per call.
struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

SplitRegex::~SplitRegex() = default;

std::string translate_pattern(std::string_view p) {
  // Oniguruma's (the `tokenizers` library's) Unicode \s is the White_Space property. PCRE2's UCP
  // \s differs both ways: it leaves out U+0085 and takes in U+180E (through \h; not White_Space
  // since Unicode 6.3), which moves token boundaries around that character. So \s is spelled out
  // as White_Space itself. Everything else in the Qwen patterns (\p{L}, \p{N}, \p{M}, (?i:...),
  // (?!...)) means the same in both.
  constexpr std::string_view kWhiteSpace =
      "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      if (n == 's') {
        if (!in_class) out += '[';
        out += kWhiteSpace;
        if (!in_class) out += ']';
      } else if (n == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpace;
        out += ']';
      } else {
        out += '\\';
        out += n;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::unique_ptr<SplitRegex> SplitRegex::compile(const std::string& pattern, std::string& error) {
  std::unique_ptr<SplitRegex> re(new SplitRegex());
  re->pattern_ = pattern;
  re->translated_ = translate_pattern(pattern);
  re->code_ = std::make_unique<Code>();
  int err = 0;
  PCRE2_SIZE offset = 0;
  re->code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re->translated_.data()),
                                  re->translated_.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset,
                                  nullptr);
  if (!re->code_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    error = "pre_tokenizer Split regex does not compile at offset " + std::to_string(offset) +
            ": " + reinterpret_cast<const char*>(msg);
    return nullptr;
  }
  // JIT is an optimisation: without it (e.g. unsupported CPU) matching still works.
  pcre2_jit_compile(re->code_->code, PCRE2_JIT_COMPLETE);
  return re;
}

void SplitRegex::split_into(std::string_view text,
                            std::vector<std::pair<std::size_t, std::size_t>>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md,
                               nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    std::size_t b = ov[0], e = ov[1];
    if (b > last) pieces.emplace_back(last, b);  // unmatched gap is its own piece
    if (e > b) {
      pieces.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step one character forward.
      pos = e + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      if (pos > text.size()) break;
      e = b;
    }
    last = e;
  }
  if (last < text.size()) pieces.emplace_back(last, text.size());
  pcre2_match_data_free(md);
}

}  // namespace kiln::engine
