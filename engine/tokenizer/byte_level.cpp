#include "engine/tokenizer/byte_level.h"

#include <vector>

#include "engine/tokenizer/utf8.h"

namespace kiln::engine::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> char_of;
  std::array<unsigned char, 256> order{};
  std::array<int, 512> byte_of_cp{};  // code point (< 512) → byte, -1 if none
  Tables() {
    byte_of_cp.fill(-1);
    std::vector<int> printable;
    for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
    std::array<bool, 256> is_printable{};
    std::size_t k = 0;
    for (int b : printable) {
      is_printable[b] = true;
      order[k++] = static_cast<unsigned char>(b);
      set(b, static_cast<char32_t>(b));
    }
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      if (is_printable[b]) continue;
      order[k++] = static_cast<unsigned char>(b);
      set(b, static_cast<char32_t>(256 + n++));
    }
  }
  void set(int b, char32_t cp) {
    utf8::append_codepoint(char_of[b], cp);
    byte_of_cp[cp] = b;
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& char_of_byte(unsigned char b) { return tables().char_of[b]; }

const std::array<unsigned char, 256>& byte_order() { return tables().order; }

std::optional<std::string> decode(std::string_view s) {
  const Tables& t = tables();
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    char32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
      i += 2;
    } else {
      return std::nullopt;  // all 256 characters are below U+0800
    }
    if (cp >= t.byte_of_cp.size() || t.byte_of_cp[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte_of_cp[cp]));
  }
  return out;
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += char_of_byte(static_cast<unsigned char>(c));
  return out;
}

}  // namespace kiln::engine::byte_level
