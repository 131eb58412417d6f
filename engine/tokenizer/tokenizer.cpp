// Tokenizer: loading tokenizer.json and the encode/decode pipeline (see tokenizer.h).
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace kiln::engine {

using nlohmann::json;

struct Tokenizer::Impl {
  std::vector<std::string> id_bytes;  // id → bytes ("" for gaps)
  std::vector<unsigned char> flags;   // bit 0: added, bit 1: special
  std::unordered_map<std::string, TokenId> bytes_to_id;
  std::vector<AddedToken> added;
  // Added tokens by first byte, longest first, for leftmost-longest matching.
  std::array<std::vector<std::size_t>, 256> added_by_first;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<SplitRegex> split;
  Normalization normalization = Normalization::none;
  std::string chat_template;
  std::optional<TokenId> eos;

  void encode_segment(std::string_view seg, std::vector<TokenId>& out) const;
  void encode_valid(std::string_view run, std::vector<TokenId>& out) const;
};

namespace {

const std::string kEmpty;
const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string escape_regex(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

bool read_text_file(const std::string& path, std::string& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot open";
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  if (out.size() >= 2 && static_cast<unsigned char>(out[0]) == 0x1F &&
      static_cast<unsigned char>(out[1]) == 0x8B) {
    // gzip: inflate in memory (the test assets ship tokenizer.json.gz).
    z_stream zs{};
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
      error = path + ": zlib init failed";
      return false;
    }
    std::string plain;
    zs.next_in = reinterpret_cast<Bytef*>(out.data());
    zs.avail_in = static_cast<uInt>(out.size());
    char buf[1 << 16];
    int rc = Z_OK;
    while (rc == Z_OK) {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof buf;
      rc = inflate(&zs, Z_NO_FLUSH);
      plain.append(buf, sizeof buf - zs.avail_out);
    }
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) {
      error = path + ": corrupt gzip data";
      return false;
    }
    out = std::move(plain);
  }
  return true;
}

namespace {

// Reads the normalizer field; only Unicode normal forms (or a Sequence of one) are supported.
bool load_normalizer(const json& n, Normalization& out, std::string& error) {
  out = Normalization::none;
  if (n.is_null()) return true;
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string()) {
    error = "normalizer: expected null or an object with a \"type\"";
    return false;
  }
  const std::string type = n["type"];
  if (type == "Sequence") {
    for (const json& item : n.value("normalizers", json::array())) {
      Normalization one;
      if (!load_normalizer(item, one, error)) return false;
      if (one != Normalization::none) out = one;
    }
    return true;
  }
  if (!parse_normalization(type, out)) {
    error = "normalizer.type: unsupported \"" + type + "\" (supported: NFC, NFD, NFKC, NFKD)";
    return false;
  }
  return true;
}

// Reads the pre_tokenizer field into one split pattern.
bool load_pre_tokenizer(const json& p, std::string& pattern, std::string& error) {
  if (p.is_null()) {
    error = "pre_tokenizer: missing (a byte-level BPE needs a split regex)";
    return false;
  }
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& item : p.value("pretokenizers", json::array()))
      if (!load_pre_tokenizer(item, pattern, error)) return false;
    return true;
  }
  if (type == "Split") {
    if (!pattern.empty()) {
      error = "pre_tokenizer: more than one Split is not supported";
      return false;
    }
    if (p.value("behavior", "Isolated") != "Isolated" || p.value("invert", false)) {
      error = "pre_tokenizer.Split: only behavior Isolated, invert false is supported";
      return false;
    }
    const json& pat = p.value("pattern", json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string()) pattern = pat["Regex"];
    else if (pat.contains("String") && pat["String"].is_string())
      pattern = escape_regex(pat["String"].get<std::string>());
    else {
      error = "pre_tokenizer.Split.pattern: expected {\"Regex\": ...} or {\"String\": ...}";
      return false;
    }
    return true;
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) {
      error = "pre_tokenizer.ByteLevel.add_prefix_space=true is not supported";
      return false;
    }
    if (p.value("use_regex", true) && pattern.empty()) pattern = kGpt2Pattern;
    return true;
  }
  error = "pre_tokenizer.type: unsupported \"" + type + "\"";
  return false;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

TokenizerLoad Tokenizer::load_model_dir(const std::string& dir) {
  const std::string config = dir + "/tokenizer_config.json";
  std::ifstream probe(config);
  TokenizerLoad load = load_file(dir + "/tokenizer.json", probe ? config : std::string());
  // Newer Hugging Face repos keep the template in its own file (Qwen3.6: chat_template.jinja).
  std::string jinja, ignored;
  if (load.ok() && load.tokenizer->impl_->chat_template.empty() &&
      read_text_file(dir + "/chat_template.jinja", jinja, ignored))
    load.tokenizer->impl_->chat_template = std::move(jinja);
  return load;
}

TokenizerLoad Tokenizer::load_file(const std::string& path, const std::string& config_path) {
  TokenizerLoad result;
  std::string text, config;
  if (!read_text_file(path, text, result.error)) return result;
  if (!config_path.empty() && !read_text_file(config_path, config, result.error)) return result;
  return load_json_text(text, config, path);
}

TokenizerLoad Tokenizer::load_json_text(std::string_view text, std::string_view config_text,
                                        const std::string& source) {
  // A hand-edited or truncated file can hold a field of the wrong type anywhere ("type": 5); the
  // JSON library throws on reading it, and loading must say so rather than end the process.
  try {
    return load_json_text_unguarded(text, config_text, source);
  } catch (const std::exception& e) {
    TokenizerLoad failed;
    failed.error = source + ": malformed: " + e.what();
    return failed;
  }
}

TokenizerLoad Tokenizer::load_json_text_unguarded(std::string_view text, std::string_view config_text,
                                                  const std::string& source) {
  TokenizerLoad result;
  auto fail = [&](const std::string& what) {
    result.error = source + ": " + what;
    return std::move(result);
  };
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
  auto impl = std::make_unique<Impl>();

  std::string error;
  if (!load_normalizer(j.value("normalizer", json()), impl->normalization, error))
    return fail(error);
  std::string pattern;
  if (!load_pre_tokenizer(j.value("pre_tokenizer", json()), pattern, error)) return fail(error);
  impl->split = SplitRegex::compile(pattern, error);
  if (!impl->split) return fail(error);

  const json& model = j.value("model", json());
  if (!model.is_object() || model.value("type", "BPE") != "BPE")
    return fail("model.type: only BPE is supported");
  if (model.value("byte_fallback", false)) return fail("model.byte_fallback: not supported");
  const json& vocab = model.value("vocab", json());
  if (!vocab.is_object() || vocab.empty()) return fail("model.vocab: expected a non-empty object");
  // Vocab spelling → id, for resolving merges (faster than the JSON object's std::map).
  std::unordered_map<std::string, TokenId> spelled;
  spelled.reserve(vocab.size());
  for (const auto& [key, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<long long>() < 0)
      return fail("model.vocab[\"" + key + "\"]: expected a non-negative integer id");
    const auto id = value.get<TokenId>();
    auto bytes = byte_level::decode(key);
    if (!bytes) return fail("model.vocab[\"" + key + "\"]: not a byte-level token");
    if (static_cast<std::size_t>(id) >= impl->id_bytes.size()) impl->id_bytes.resize(id + 1);
    impl->id_bytes[id] = *bytes;
    impl->bytes_to_id.emplace(std::move(*bytes), id);
    spelled.emplace(key, id);
  }
  std::array<TokenId, 256> byte_ids;
  for (int b = 0; b < 256; ++b) {
    auto it = impl->bytes_to_id.find(std::string(1, static_cast<char>(b)));
    byte_ids[b] = it == impl->bytes_to_id.end() ? -1 : it->second;
  }

  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) return fail("model.merges: expected an array");
  MergeTable table;
  table.reserve(merges.size());
  std::uint32_t rank = 0;
  for (const json& m : merges) {
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const std::string s = m;
      const auto sp = s.find(' ', 1);
      if (sp == std::string::npos) return fail("model.merges[" + std::to_string(rank) + "]: no space");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0];
      right = m[1];
    } else {
      return fail("model.merges[" + std::to_string(rank) + "]: expected \"a b\" or [a, b]");
    }
    const auto l = spelled.find(left), r = spelled.find(right), lr = spelled.find(left + right);
    if (l == spelled.end() || r == spelled.end() || lr == spelled.end())
      return fail("model.merges[" + std::to_string(rank) + "]: token not in vocab");
    table.insert(l->second, r->second, rank, lr->second);
    ++rank;
  }
  impl->bpe = std::make_unique<BpeModel>(byte_ids, std::move(table));

  const json& added = j.value("added_tokens", json::array());
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string() ||
        a["content"].get<std::string>().empty())
      return fail("added_tokens[" + std::to_string(i) + "]: expected {id, content}");
    AddedToken t{a["id"].get<TokenId>(), a["content"].get<std::string>(), a.value("special", false)};
    if (t.id < 0) return fail("added_tokens[" + std::to_string(i) + "].id: negative");
    if (static_cast<std::size_t>(t.id) >= impl->id_bytes.size()) impl->id_bytes.resize(t.id + 1);
    impl->id_bytes[t.id] = t.content;
    impl->added.push_back(std::move(t));
  }
  impl->flags.assign(impl->id_bytes.size(), 0);
  for (std::size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->flags[t.id] = 1 | (t.special ? 2 : 0);
    impl->added_by_first[static_cast<unsigned char>(t.content[0])].push_back(i);
  }
  for (auto& list : impl->added_by_first)
    std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
      return impl->added[a].content.size() > impl->added[b].content.size();
    });

  if (!config_text.empty()) {
    json c = json::parse(config_text, nullptr, false);
    if (c.is_discarded() || !c.is_object()) return fail("tokenizer_config.json: not a JSON object");
    const json& tpl = c.value("chat_template", json());
    if (tpl.is_string()) {
      impl->chat_template = tpl;
    } else if (tpl.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const json& t : tpl)
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template"))
          impl->chat_template = t["template"].get<std::string>();
    }
    const json& eos = c.value("eos_token", json());
    std::string eos_text = eos.is_string() ? eos.get<std::string>()
                           : eos.is_object() ? eos.value("content", "") : "";
    for (const AddedToken& t : impl->added)
      if (t.content == eos_text) impl->eos = t.id;
  }
  result.tokenizer.reset(new Tokenizer(std::move(impl)));
  return result;
}

void Tokenizer::Impl::encode_valid(std::string_view run, std::vector<TokenId>& out) const {
  std::string normalized;
  if (normalization != Normalization::none) {
    normalized = normalize_text(run, normalization);
    run = normalized;
  }
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  split->split_into(run, pieces);
  for (auto [b, e] : pieces) bpe->encode_piece(run.substr(b, e - b), out);
}

void Tokenizer::Impl::encode_segment(std::string_view seg, std::vector<TokenId>& out) const {
  // Valid UTF-8 runs go through normalizer + regex; each invalid byte is a piece of its own.
  std::size_t run_start = 0, i = 0, bad = 0;
  bool truncated = false;
  while (i < seg.size()) {
    if (static_cast<unsigned char>(seg[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = utf8::sequence_length(seg, i, bad, truncated);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > run_start) encode_valid(seg.substr(run_start, i - run_start), out);
    for (std::size_t k = 0; k < bad; ++k) bpe->encode_piece(seg.substr(i + k, 1), out);
    i += bad;
    run_start = i;
  }
  if (i > run_start) encode_valid(seg.substr(run_start, i - run_start), out);
}

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out) const {
  encode_append(text, out, {});
}

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out,
                              std::span<const TextSpan> literal) const {
  const Impl& m = *impl_;
  std::size_t seg_start = 0, next = 0;  // literal[next]: the first span not wholly before i
  for (std::size_t i = 0; i < text.size(); ++i) {
    while (next < literal.size() && literal[next].end <= i) ++next;
    if (next < literal.size() && literal[next].begin <= i) {  // inside a literal span
      i = literal[next].end - 1;
      continue;
    }
    const std::size_t room = next < literal.size() ? literal[next].begin - i : text.size() - i;
    const auto& cands = m.added_by_first[static_cast<unsigned char>(text[i])];
    if (cands.empty()) continue;
    for (std::size_t idx : cands) {
      const AddedToken& t = m.added[idx];
      if (t.content.size() <= room && text.compare(i, t.content.size(), t.content) == 0) {
        if (i > seg_start) m.encode_segment(text.substr(seg_start, i - seg_start), out);
        out.push_back(t.id);
        i += t.content.size() - 1;
        seg_start = i + 1;
        break;
      }
    }
  }
  if (seg_start < text.size()) m.encode_segment(text.substr(seg_start), out);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

std::vector<TokenId> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<TokenId> out;
  impl_->encode_segment(text, out);
  return out;
}

std::string Tokenizer::decode_bytes(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_bytes.size()) continue;
    if (skip_special && (impl_->flags[id] & 2)) continue;
    out += impl_->id_bytes[id];
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  return utf8::to_lossy(decode_bytes(ids, skip_special));
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_bytes.size()) return kEmpty;
  return impl_->id_bytes[id];
}

std::optional<TokenId> Tokenizer::token_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  if (auto bytes = byte_level::decode(token)) {
    auto it = impl_->bytes_to_id.find(*bytes);
    if (it != impl_->bytes_to_id.end()) return it->second;
  }
  auto it = impl_->bytes_to_id.find(std::string(token));
  if (it != impl_->bytes_to_id.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->flags.size() && (impl_->flags[id] & 2);
}
bool Tokenizer::is_added(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->flags.size() && (impl_->flags[id] & 1);
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
std::size_t Tokenizer::vocab_size() const { return impl_->id_bytes.size(); }

std::string Tokenizer::normalize(std::string_view text) const {
  return normalize_text(text, impl_->normalization);
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  impl_->split->split_into(text, pieces);
  std::vector<std::string> out;
  for (auto [b, e] : pieces) out.emplace_back(text.substr(b, e - b));
  return out;
}

const std::string& Tokenizer::split_pattern() const { return impl_->split->pattern(); }
bool Tokenizer::normalizes_nfc() const { return impl_->normalization == Normalization::nfc; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
std::optional<TokenId> Tokenizer::eos_token_id() const { return impl_->eos; }

}  // namespace kiln::engine
