// Unicode normalisation declared by tokenizer.json's "normalizer" (Qwen3: NFC; Qwen3.5/3.6: none).
#pragma once

#include <string>
#include <string_view>

namespace kiln::engine {

enum class Normalization { none, nfc, nfd, nfkc, nfkd };

// Parses a tokenizer.json normalizer "type" (also inside a "Sequence"); error on anything else.
bool parse_normalization(std::string_view type, Normalization& out);

// Applies the normalisation to valid UTF-8 `text` (ICU). ASCII text is returned unchanged
// without calling ICU.
std::string normalize_text(std::string_view text, Normalization form);

}  // namespace kiln::engine
