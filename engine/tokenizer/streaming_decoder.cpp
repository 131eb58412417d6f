#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace kiln::engine {

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamingDecoder::drain(bool final) {
  const std::size_t n = final ? pending_.size() : utf8::releasable_prefix(pending_);
  std::string out = utf8::to_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamingDecoder::push(TokenId id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  return drain(false);
}

std::string StreamingDecoder::push(std::span<const TokenId> ids) {
  for (TokenId id : ids)
    if (!(skip_special_ && tokenizer_.is_special(id))) pending_ += tokenizer_.token_bytes(id);
  return drain(false);
}

std::string StreamingDecoder::flush() { return drain(true); }

}  // namespace kiln::engine
