// Small UTF-8 helpers shared by the tokenizer and the streaming decoder.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::engine::utf8 {

// Looks at the sequence starting at s[i]. Returns its length when it is a complete valid UTF-8
// character. Otherwise returns 0 and sets `bad_len` to the length of the maximal invalid subpart
// (the unit that becomes one U+FFFD, as in Rust's from_utf8_lossy / WHATWG), and `truncated` to
// true when that subpart is a valid prefix cut off by the end of `s`.
std::size_t sequence_length(std::string_view s, std::size_t i, std::size_t& bad_len,
                            bool& truncated);

bool is_valid(std::string_view s);

// Every invalid subpart replaced by U+FFFD.
std::string to_lossy(std::string_view s);

// Length of the longest prefix of `s` that does not end inside a possibly-valid incomplete
// character (what a streaming decoder may release now).
std::size_t releasable_prefix(std::string_view s);

void append_codepoint(std::string& out, char32_t cp);

}  // namespace kiln::engine::utf8
