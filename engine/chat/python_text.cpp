#include "engine/chat/python_text.h"

#include <algorithm>
#include <cmath>
#include <charconv>

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
  // Python repr(float): the shortest digits that round-trip, the closest to the value among those
  // (std::to_chars guarantees the same), in fixed notation for exponents -4..15 (with at least
  // one decimal: "100.0") and as d.ddde+XX otherwise ("1e-05", "1e+16").
  if (!std::isfinite(d)) return nlohmann::ordered_json(d).dump();  // JSON has no inf/nan
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const std::size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp);
  // Built by appending (GCC 12 warns falsely, -Wrestrict, on "." + std::string temporaries).
  if (-4 <= exp && exp < 16) {
    if (exp >= 0) {
      const auto point = static_cast<std::size_t>(exp) + 1;
      for (std::size_t i = 0; i < point; ++i) out.push_back(i < digits.size() ? digits[i] : '0');
      out.push_back('.');
      if (digits.size() > point) out.append(digits, point, std::string::npos);
      else out.push_back('0');
    } else {
      out.append("0.");
      out.append(static_cast<std::size_t>(-exp - 1), '0');
      out.append(digits);
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1, std::string::npos);
  }
  out.append(exp < 0 ? "e-" : "e+");
  const int magnitude = exp < 0 ? -exp : exp;
  if (magnitude < 10) out.push_back('0');
  out.append(std::to_string(magnitude));
  return out;
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
