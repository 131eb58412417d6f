#include "tools/text.h"

#include <algorithm>
#include <cstdio>

namespace kiln::tools {

std::vector<std::size_t> line_starts(std::string_view text) {
  std::vector<std::size_t> starts = {0};
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' && i + 1 < text.size()) starts.push_back(i + 1);
  }
  return starts;
}

std::size_t line_of(const std::vector<std::size_t>& starts, std::size_t offset) {
  return static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin());
}

std::string numbered(std::string_view text, std::size_t first, std::size_t last) {
  auto starts = line_starts(text);
  std::size_t n = line_count(text);
  first = std::max<std::size_t>(first, 1);
  last = std::min(last, n);
  std::string out;
  for (std::size_t line = first; line <= last; ++line) {
    std::size_t begin = starts[line - 1];
    std::size_t end = line < starts.size() ? starts[line] : text.size();
    std::string_view body = text.substr(begin, end - begin);
    if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
    if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
    char number[16];
    std::snprintf(number, sizeof number, "%6zu\t", line);
    out += number;
    out += body;
    out += '\n';
  }
  return out;
}

std::string edit_excerpt(std::string_view text, std::size_t first, std::size_t last, std::size_t context) {
  const std::size_t from = first > context ? first - context : 1, to = last + context;
  if (to - from + 1 <= 2 * kExcerptEdgeLines + 1) return numbered(text, from, to);
  const std::size_t head_end = from + kExcerptEdgeLines - 1, tail_start = std::min(to, line_count(text)) - kExcerptEdgeLines + 1;
  if (tail_start <= head_end + 1) return numbered(text, from, to);
  return numbered(text, from, head_end) + "[... " + std::to_string(tail_start - head_end - 1) + " lines not shown ...]\n" +
         numbered(text, tail_start, to);
}

std::string line_ending(std::string_view text) {
  std::size_t lf = 0, crlf = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') (i > 0 && text[i - 1] == '\r') ? ++crlf : ++lf;
  }
  return crlf > lf ? "\r\n" : "\n";
}

std::string with_line_ending(std::string_view s, const std::string& eol) {
  if (eol == "\n") return std::string(s);
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' && (i == 0 || s[i - 1] != '\r')) {
      out += eol;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::size_t line_count(std::string_view text) {
  if (text.empty()) return 0;
  std::size_t n = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  return text.back() == '\n' ? n : n + 1;
}

}  // namespace kiln::tools
