// The byte-level BPE tokenizer of the Qwen family, read from a Hugging Face `tokenizer.json`.
//
// Pipeline of encode(), mirroring the `tokenizers` library:
//   1. added tokens (special or not) are matched atomically, leftmost-longest, on the raw text;
//   2. each remaining segment is normalised (NFC when the file declares it);
//   3. split by the pre-tokenizer regex read from the file (PCRE2 JIT, UTF + UCP);
//   4. each piece is mapped to bytes and merged by BPE merge rank.
// Input that is not valid UTF-8 is accepted: each invalid byte becomes its own piece, so
// decode_bytes(encode(s)) == s for any bytes s the normaliser leaves alone.
//
// Thread-safety: a loaded Tokenizer is immutable; the BPE piece cache is per thread (bpe.cpp), so
// encode/decode may be called from any number of threads without locking.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::engine {

using TokenId = std::int32_t;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;  // skipped by decode(skip_special=true); matched on encode either way
};

class Tokenizer;

// A byte range [begin, end) of a text.
struct TextSpan {
  std::size_t begin = 0, end = 0;
};

// Result of loading: either a tokenizer or an error naming the file and field at fault.
struct TokenizerLoad {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string error;
  bool ok() const { return tokenizer != nullptr; }
};

class Tokenizer {
 public:
  // `dir`/tokenizer.json plus, when present, `dir`/tokenizer_config.json (chat template, eos)
  // and `dir`/chat_template.jinja (used when the config has no chat_template).
  static TokenizerLoad load_model_dir(const std::string& dir);
  // A tokenizer.json (or tokenizer.json.gz) file; `config_path` may be empty.
  static TokenizerLoad load_file(const std::string& tokenizer_json_path,
                                 const std::string& config_path = "");
  // The file contents themselves; `source` names them in error messages.
  static TokenizerLoad load_json_text(std::string_view tokenizer_json,
                                      std::string_view config_json = {},
                                      const std::string& source = "tokenizer.json");

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Text → ids. Added tokens in the text are matched atomically first.
  std::vector<TokenId> encode(std::string_view text) const;
  // Same, appending to `out`.
  void encode_append(std::string_view text, std::vector<TokenId>& out) const;
  // Same, but no added token is matched that overlaps a `literal` span (sorted, disjoint, offsets
  // into `text`): those bytes are ordinary text even where they spell "<|im_end|>". A chat
  // prompt marks the messages' text so that a file or command output cannot end a turn.
  void encode_append(std::string_view text, std::vector<TokenId>& out, std::span<const TextSpan> literal) const;
  // Text → ids with no added-token matching ("<|im_end|>" becomes ordinary text).
  std::vector<TokenId> encode_ordinary(std::string_view text) const;

  // Ids → raw bytes (may end inside a UTF-8 character). Unknown ids are skipped.
  std::string decode_bytes(std::span<const TokenId> ids, bool skip_special = false) const;
  // Ids → valid UTF-8; invalid byte sequences become U+FFFD (as the `tokenizers` library does).
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The bytes of one token ("" for an unknown id).
  const std::string& token_bytes(TokenId id) const;
  // Id of an added token by content ("<|im_end|>"), else of a vocab entry by its tokenizer.json
  // spelling ("Ġthe"), else of the single token whose bytes are exactly `token`.
  std::optional<TokenId> token_id(std::string_view token) const;
  bool is_special(TokenId id) const;
  bool is_added(TokenId id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // Number of ids: max id + 1 over vocab and added tokens.
  std::size_t vocab_size() const;

  // Steps of the pipeline, exposed for tests and tools.
  std::string normalize(std::string_view text) const;
  std::vector<std::string> pre_tokenize(std::string_view normalized_text) const;
  const std::string& split_pattern() const;  // as read from the file
  bool normalizes_nfc() const;

  // From tokenizer_config.json (empty / nullopt when absent).
  const std::string& chat_template() const;
  std::optional<TokenId> eos_token_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  // load_json_text without the guard against a field of an unexpected JSON type (which throws).
  static TokenizerLoad load_json_text_unguarded(std::string_view tokenizer_json, std::string_view config_json,
                                                const std::string& source);
  std::unique_ptr<Impl> impl_;
};

// Reads a whole file, inflating it when it is gzip-compressed (tokenizer.json.gz). On failure
// returns false with an error naming the path.
bool read_text_file(const std::string& path, std::string& out, std::string& error);

// Turns a stream of ids into UTF-8 text pieces without ever splitting a character: bytes of an
// incomplete multi-byte character are held until the character completes. Byte sequences that
// can never become valid are emitted as U+FFFD at once. Owned by one thread (one per sequence).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Text that became complete with this id (often empty for a partial character).
  std::string push(TokenId id);
  std::string push(std::span<const TokenId> ids);
  // Remaining held bytes (an incomplete character) as U+FFFD; resets the decoder.
  std::string flush();
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string drain(bool final);
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kiln::engine
