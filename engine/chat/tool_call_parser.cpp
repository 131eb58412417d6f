// ToolCallParser: the streaming state machine (reasoning → content ⇄ tool call). The body of a
// complete <tool_call> is parsed and typed in tool_call_body.cpp.
#include "engine/chat/tool_call_parser.h"

#include "engine/chat/tool_call_body.h"
#include "engine/tokenizer/utf8.h"

namespace kiln::engine {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view skip_ws(std::string_view s) {
  std::size_t k = 0;
  while (k < s.size() && is_ws(s[k])) ++k;
  return s.substr(k);
}

// Length of the longest suffix of `s` that is a proper prefix of one of `tags` (text that might
// still become a tag when more input arrives).
std::size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  std::size_t best = 0;
  for (std::string_view tag : tags) {
    const std::size_t max = std::min(s.size(), tag.size() - 1);
    for (std::size_t n = max; n > best; --n)
      if (s.substr(s.size() - n) == tag.substr(0, n)) {
        best = n;
        break;
      }
  }
  return best;
}

// Emits text with leading whitespace dropped and trailing whitespace held back until more
// non-space text follows, so the concatenated output is trimmed however the input was split.
void emit_trimmed(std::string_view text, bool& started, std::string& held, std::string& out) {
  for (char c : text) {
    if (is_ws(c)) {
      if (started) held += c;
      continue;
    }
    started = true;
    out += held;
    held.clear();
    out += c;
  }
}

// Where the JSON value starting at s[0] == '{' ends (one past its closing brace), skipping
// braces inside strings; npos while it is still open.
std::size_t json_object_end(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// Position of the first `close` in `s` that is structural: not inside a <parameter=…> value (a
// value ends only at a </parameter> followed, after whitespace, by <parameter= or </function>,
// the rule parse_xml applies), nor inside the JSON object of the JSON call form. So a file whose
// text contains "</parameter>" and "</tool_call>" does not cut the call short. npos while the
// call may still be open.
std::size_t find_structural_close(std::string_view s, std::string_view close) {
  constexpr std::string_view kParamOpen = "<parameter=", kParamClose = "</parameter>";
  const std::size_t i = s.size() - skip_ws(s).size();
  if (i < s.size() && s[i] == '{') {  // {"name": …, "arguments": …}
    const std::size_t e = json_object_end(s.substr(i));
    return e == std::string_view::npos ? e : s.find(close, i + e);
  }
  std::size_t at = 0;
  while (true) {
    const std::size_t c = s.find(close, at), open = s.find(kParamOpen, at);
    if (c == std::string_view::npos || c < open) return c;
    // A parameter value starts after its tag; find where it really ends.
    std::size_t from = open + kParamOpen.size();
    std::size_t value_end = std::string_view::npos;
    while (true) {
      const std::size_t shut = s.find(kParamClose, from);
      if (shut == std::string_view::npos) return std::string_view::npos;  // still open
      const std::string_view rest = skip_ws(s.substr(shut + kParamClose.size()));
      const std::size_t k = s.size() - rest.size();
      // In a <tool_call>, "</parameter></tool_call>" ends the value too: the call then lacks its
      // </function>, an error for the model, rather than swallowing the next call into the value.
      const bool call_close = close == kCallClose && rest.substr(0, kCallClose.size()) == kCallClose;
      if (rest.substr(0, kParamOpen.size()) == kParamOpen || rest.substr(0, kFunctionClose.size()) == kFunctionClose ||
          call_close) {
        value_end = k;
        break;
      }
      // Not followed by anything yet: more input decides (at the end, finish() falls back).
      if (kParamOpen.substr(0, rest.size()) == rest || kFunctionClose.substr(0, rest.size()) == rest ||
          (close == kCallClose && kCallClose.substr(0, rest.size()) == rest))
        return std::string_view::npos;
      from = shut + 1;  // "</parameter>" inside the value
    }
    at = value_end;
  }
}

}  // namespace

std::string_view parse_error_kind_name(ParseErrorKind kind) {
  switch (kind) {
    case ParseErrorKind::unclosed_tag: return "unclosed_tag";
    case ParseErrorKind::unknown_function: return "unknown_function";
    case ParseErrorKind::missing_parameter: return "missing_parameter";
    case ParseErrorKind::wrong_type: return "wrong_type";
    case ParseErrorKind::unknown_parameter: return "unknown_parameter";
    case ParseErrorKind::duplicate_parameter: return "duplicate_parameter";
    case ParseErrorKind::malformed: return "malformed";
  }
  return "?";
}

void ParsedOutput::append(const ParsedOutput& o) {
  reasoning += o.reasoning;
  content += o.content;
  tool_calls.insert(tool_calls.end(), o.tool_calls.begin(), o.tool_calls.end());
  errors.insert(errors.end(), o.errors.begin(), o.errors.end());
}

ToolCallParser::ToolCallParser(std::vector<Json> tools, ToolCallParserOptions options)
    : tools_(std::move(tools)),
      options_(options),
      state_(options.starts_in_reasoning ? State::reasoning : State::content) {}

ParsedOutput ToolCallParser::feed(std::string_view chunk) {
  ParsedOutput out;
  if (finished_) return out;
  buffer_.append(chunk);
  step(out, false);
  total_.append(out);
  return out;
}

ParsedOutput ToolCallParser::finish() {
  ParsedOutput out;
  if (finished_) return out;
  step(out, true);
  finished_ = true;
  total_.append(out);
  return out;
}

void ToolCallParser::step(ParsedOutput& out, bool final) {
  while (true) {
    if (state_ == State::reasoning) {
      if (!reasoning_started_) {
        // A model may repeat the "<think>" that ends the prompt; drop it.
        std::size_t k = 0;
        while (k < buffer_.size() && is_ws(buffer_[k])) ++k;
        std::string_view rest = std::string_view(buffer_).substr(k);
        if (!final && rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest)
          return;
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) buffer_.erase(0, k + kThinkOpen.size());
      }
      const std::size_t p = buffer_.find(kThinkClose);
      if (p != std::string::npos) {
        std::string held;  // whitespace right before </think> is not reasoning
        emit_trimmed(std::string_view(buffer_).substr(0, p), reasoning_started_, held_whitespace_,
                     out.reasoning);
        held_whitespace_.clear();
        reasoning_started_ = true;
        buffer_.erase(0, p + kThinkClose.size());
        state_ = State::content;
        continue;
      }
      std::size_t n = final ? buffer_.size()
                            : buffer_.size() - partial_tag_suffix(buffer_, {kThinkClose});
      if (!final) n = utf8::releasable_prefix(std::string_view(buffer_).substr(0, n));
      emit_trimmed(std::string_view(buffer_).substr(0, n), reasoning_started_, held_whitespace_,
                   out.reasoning);
      buffer_.erase(0, n);
      if (final) {
        held_whitespace_.clear();
        out.errors.push_back({ParseErrorKind::unclosed_tag,
                              "unclosed <think>: the output ended before </think>", "", "",
                              call_count_});
      }
      return;
    }

    if (state_ == State::content) {
      // Earliest tag that changes state (or a stray tag to drop).
      std::size_t best = std::string::npos;
      std::string_view tag;
      for (std::string_view t : {kCallOpen, kFunctionOpen, kCallClose, kThinkOpen, kThinkClose}) {
        const std::size_t p = buffer_.find(t);
        if (p < best) {
          best = p;
          tag = t;
        }
      }
      if (best != std::string::npos) {
        emit_content(out, std::string_view(buffer_).substr(0, best), true);
        if (tag == kCallOpen || tag == kFunctionOpen) {
          held_whitespace_.clear();  // whitespace before a call is not content
          bare_function_ = tag == kFunctionOpen;
          buffer_.erase(0, best + (bare_function_ ? 0 : tag.size()));
          state_ = State::tool_call;
        } else if (tag == kThinkOpen && !content_started_ && out.content.empty() &&
                   total_.content.empty()) {
          // Thinking was off in the prompt but the model opened a think block anyway.
          buffer_.erase(0, best + tag.size());
          reasoning_started_ = false;
          state_ = State::reasoning;
        } else {
          buffer_.erase(0, best + tag.size());  // stray closing tag: drop it
        }
        continue;
      }
      std::size_t n = final ? buffer_.size()
                            : buffer_.size() - partial_tag_suffix(buffer_, {kCallOpen, kFunctionOpen,
                                                                            kCallClose, kThinkOpen,
                                                                            kThinkClose});
      if (!final) n = utf8::releasable_prefix(std::string_view(buffer_).substr(0, n));
      emit_content(out, std::string_view(buffer_).substr(0, n), final);
      buffer_.erase(0, n);
      if (final) held_whitespace_.clear();
      return;
    }

    // state_ == tool_call
    const std::string_view close = bare_function_ ? kFunctionClose : kCallClose;
    std::size_t p = find_structural_close(buffer_, close);
    // At the end, a close tag that looked like part of an open parameter value is the close
    // after all: parse the body so the error names the unclosed parameter.
    if (p == std::string::npos && final) p = buffer_.rfind(close);
    // The output ended right after a complete </function> without </tool_call>: the call is
    // whole (vLLM's qwen3_coder parser accepts it too).
    if (p == std::string::npos && final && !bare_function_) {
      std::size_t e = buffer_.size();
      while (e > 0 && is_ws(buffer_[e - 1])) --e;
      if (std::string_view(buffer_).substr(0, e).ends_with(kFunctionClose)) p = buffer_.size();
    }
    if (p == std::string::npos) {
      if (!final) return;
      const std::size_t index = call_count_++;
      out.errors.push_back(
          {ParseErrorKind::unclosed_tag,
           "tool call #" + std::to_string(index + 1) + ": unclosed " +
               (bare_function_ ? "<function=…>: the output ended before </function>"
                               : "<tool_call>: the output ended before </tool_call>"),
           "", "", index});
      buffer_.clear();
      state_ = State::content;
      return;
    }
    const std::size_t end = bare_function_ ? p + close.size() : p;
    finish_call(out, std::string_view(buffer_).substr(0, end), bare_function_);
    buffer_.erase(0, p + close.size());
    state_ = State::content;
  }
}

void ToolCallParser::emit_content(ParsedOutput& out, std::string_view text, bool) {
  emit_trimmed(text, content_started_, held_whitespace_, out.content);
}

void ToolCallParser::finish_call(ParsedOutput& out, std::string_view body, bool bare) {
  auto parse_one = [&](std::string_view one) {
    const std::size_t index = call_count_++;
    CallParse parsed = parse_tool_call_body(one, tools_, index);
    if (parsed.errors.empty()) out.tool_calls.push_back(std::move(parsed.call));
    else out.errors.insert(out.errors.end(), parsed.errors.begin(), parsed.errors.end());
  };
  // Several whole <function> blocks in one <tool_call> are several calls (vLLM's qwen3_coder
  // parser reads them so too); anything else after a </function> stays an error of the body.
  std::string_view rest = body;
  while (!bare) {
    const std::string_view fn = skip_ws(rest);
    if (!fn.starts_with(kFunctionOpen)) break;
    const std::size_t p = find_structural_close(fn, kFunctionClose);
    if (p == std::string_view::npos) break;
    const std::string_view after = skip_ws(fn.substr(p + kFunctionClose.size()));
    if (!after.starts_with(kFunctionOpen)) break;
    parse_one(fn.substr(0, p + kFunctionClose.size()));
    rest = after;
  }
  parse_one(rest);
}

ParsedOutput parse_model_output(std::string_view text, const std::vector<Json>& tools,
                                ToolCallParserOptions options) {
  ToolCallParser parser(tools, options);
  parser.feed(text);
  parser.finish();
  return parser.total();
}

}  // namespace kiln::engine
