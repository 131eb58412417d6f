// GPT-2's byte <-> printable-character mapping used by byte-level BPE vocabularies: the 188
// printable bytes map to themselves, the other 68 to U+0100.. in byte order ("Ġ" is the space).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::engine::byte_level {

// The character (as UTF-8) that stands for byte b in vocab/merges strings.
const std::string& char_of_byte(unsigned char b);
// The 256 bytes in GPT-2 order (printable first): token ids 0..255 of a Qwen vocabulary.
const std::array<unsigned char, 256>& byte_order();
// "Ġthe" → " the"; nullopt when a character is not one of the 256.
std::optional<std::string> decode(std::string_view vocab_string);
// " the" → "Ġthe".
std::string encode(std::string_view bytes);

}  // namespace kiln::engine::byte_level
