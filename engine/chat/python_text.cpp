#include "engine/chat/python_text.h"

#include <cstdio>

namespace kiln::engine::python {

bool is_space(char32_t c) {
  // The code points Python's str.isspace() accepts (bidirectional class WS/B/S or category Zs).
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// Decodes the character starting at s[i] (valid UTF-8 assumed; a bad byte reads as itself).
char32_t decode_at(std::string_view s, std::size_t i, std::size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) n = 1;
  char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  len = static_cast<std::size_t>(n);
  return cp;
}

}  // namespace

std::string_view strip(std::string_view s) {
  std::size_t b = 0, len = 0;
  while (b < s.size() && is_space(decode_at(s, b, len))) b += len;
  std::size_t e = s.size();
  while (e > b) {
    std::size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!is_space(decode_at(s, start, len))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

namespace {

void dump_string(std::string_view s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string float_repr(double d) {
  // Python repr(float): shortest round-trip digits. nlohmann's dump uses the same shortest
  // digits and exponent style ("1e-05", "1e+16", "2.5") but switches to exponent form one
  // decade earlier: Python prints 1e15 <= |d| < 1e16 in fixed notation ("1000000000000000.0").
  std::string s = nlohmann::ordered_json(d).dump();
  const std::size_t e = s.find("e+15");
  if (e == std::string::npos) return s;
  const bool neg = s[0] == '-';
  std::string digits;
  for (std::size_t i = neg ? 1 : 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  digits.resize(16, '0');  // 1 leading digit + 15 decimal places
  return (neg ? "-" : "") + digits + ".0";
}

}  // namespace

void dumps_to(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dumps_to(it.value(), out);
      }
      out += '}';
      break;
    }
    case T::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dumps_to(item, out);
      }
      out += ']';
      break;
    }
    case T::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case T::number_float: out += float_repr(v.get<double>()); break;
    case T::discarded: break;
    default: out += v.dump(); break;  // null, booleans, integers
  }
}

std::string dumps(const nlohmann::ordered_json& v) {
  std::string out;
  dumps_to(v, out);
  return out;
}

std::string str(const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::string: return v.get<std::string>();
    case T::boolean: return v.get<bool>() ? "True" : "False";
    case T::null: return "None";
    case T::number_float: return float_repr(v.get<double>());
    default: return dumps(v);
  }
}

}  // namespace kiln::engine::python
