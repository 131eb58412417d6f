#include "engine/tokenizer/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

namespace kiln::engine {

bool parse_normalization(std::string_view type, Normalization& out) {
  if (type == "NFC") out = Normalization::nfc;
  else if (type == "NFD") out = Normalization::nfd;
  else if (type == "NFKC") out = Normalization::nfkc;
  else if (type == "NFKD") out = Normalization::nfkd;
  else return false;
  return true;
}

namespace {

const UNormalizer2* instance(Normalization form, UErrorCode& status) {
  switch (form) {
    case Normalization::nfc: return unorm2_getNFCInstance(&status);
    case Normalization::nfd: return unorm2_getNFDInstance(&status);
    case Normalization::nfkc: return unorm2_getNFKCInstance(&status);
    case Normalization::nfkd: return unorm2_getNFKDInstance(&status);
    case Normalization::none: break;
  }
  return nullptr;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

std::string normalize_text(std::string_view text, Normalization form) {
  if (form == Normalization::none || is_ascii(text)) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* norm = instance(form, status);
  if (U_FAILURE(status) || !norm) return std::string(text);
  // UTF-8 → UTF-16 (ICU's C normaliser works on UTF-16).
  std::vector<UChar> src(text.size() + 1);
  int32_t src_len = 0;
  u_strFromUTF8(src.data(), static_cast<int32_t>(src.size()), &src_len, text.data(),
                static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status)) return std::string(text);
  if (unorm2_isNormalized(norm, src.data(), src_len, &status) && U_SUCCESS(status))
    return std::string(text);
  status = U_ZERO_ERROR;
  std::vector<UChar> dst(static_cast<std::size_t>(src_len) * 3 + 16);
  int32_t dst_len = unorm2_normalize(norm, src.data(), src_len, dst.data(),
                                     static_cast<int32_t>(dst.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    dst.resize(static_cast<std::size_t>(dst_len) + 1);
    dst_len = unorm2_normalize(norm, src.data(), src_len, dst.data(),
                               static_cast<int32_t>(dst.size()), &status);
  }
  if (U_FAILURE(status)) return std::string(text);
  std::string out(static_cast<std::size_t>(dst_len) * 3 + 4, '\0');
  int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_len, dst.data(), dst_len,
              &status);
  if (U_FAILURE(status)) return std::string(text);
  out.resize(static_cast<std::size_t>(out_len));
  return out;
}

}  // namespace kiln::engine
