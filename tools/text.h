// Line arithmetic shared by the file tools. Lines are split on '\n'; a '\r' before it belongs to
// the line ending, not to the text the model sees. Internal to tools/.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tools {

// Byte offset where each line starts (always at least one line, possibly empty).
std::vector<std::size_t> line_starts(std::string_view text);
// 1-based line number of a byte offset.
std::size_t line_of(const std::vector<std::size_t>& starts, std::size_t offset);
// Lines [first, last] (1-based, inclusive, clamped) as "%6d\t<text>\n", '\r' before '\n' dropped.
std::string numbered(std::string_view text, std::size_t first, std::size_t last);
// The excerpt an edit tool shows: numbered lines [first, last] with `context` lines either side;
// a long edit shows its first and last kExcerptEdgeLines lines with the count left out between
// (the model wrote the text; echoing all of a 3,000-line insert costs its size again in context).
inline constexpr std::size_t kExcerptEdgeLines = 12;
std::string edit_excerpt(std::string_view text, std::size_t first, std::size_t last, std::size_t context = 4);
// The dominant line ending of the text: "\r\n" when most line breaks are CRLF, else "\n".
std::string line_ending(std::string_view text);
// Converts bare '\n' in s to `eol` (for text the model wrote, to match the file's endings).
std::string with_line_ending(std::string_view s, const std::string& eol);
// Count of lines as an editor shows them (a final newline does not start a new line).
std::size_t line_count(std::string_view text);

}  // namespace kiln::tools
