// The Qwen3.5 / Qwen3.6 chat template rendered in C++ (byte-identical to the official Jinja
// templates, see README.md), plus the incremental (append-only) render a session uses.
//
// JSON values use nlohmann::ordered_json because the template prints tool schemas and tool-call
// arguments in the order they were given (json.dumps keeps insertion order).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"

namespace kiln::engine {

using Json = nlohmann::ordered_json;

enum class Role { system, user, assistant, tool };

struct ToolCall {
  std::string name;
  Json arguments = Json::object();  // {param: value}; strings are printed raw, others as JSON
  std::string id;                   // optional, not rendered by the template
};

struct ChatMessage {
  Role role = Role::user;
  std::string content;  // plain text (images/videos already replaced by their vision tokens)
  // Assistant reasoning. nullopt: split it out of `content` around "</think>" as the template does.
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only, not rendered
};

enum class TemplateFlavor {
  qwen3_5,  // scalar arguments via Python str() (True), no preserve_thinking
  qwen3_6,  // scalar arguments as JSON (true), preserve_thinking supported
};

struct RenderOptions {
  TemplateFlavor flavor = TemplateFlavor::qwen3_6;
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  bool preserve_thinking = false;  // Qwen3.6 only; ignored for qwen3_5
};

struct Conversation {
  std::vector<ChatMessage> messages;
  std::vector<Json> tools;  // OpenAI-style {"type":"function","function":{...}} objects
};

// The options that keep the prompt append-only across turns (preserve_thinking on): every
// earlier assistant turn is re-rendered exactly as it was generated.
RenderOptions append_only_options(TemplateFlavor flavor = TemplateFlavor::qwen3_6,
                                  bool enable_thinking = true);

struct RenderResult {
  std::string text;
  // Where the text came from the messages and tools (content, reasoning, tool names, arguments and
  // schemas) rather than from the template: tokenize with these as literal (Tokenizer::
  // encode_append) so that "<|im_end|>" in a file or a command's output stays ordinary text.
  std::vector<TextSpan> literal_spans;
  std::string error;  // set when the template would raise_exception(); names the message at fault
  bool ok() const { return error.empty(); }
};

// Full render of `conversation`, as `tokenizer.apply_chat_template(..., tokenize=False)` would.
RenderResult render_chat(const Conversation& conversation, const RenderOptions& options);

// Reads a render input in the Hugging Face shape: {"messages": [...], "tools": [...],
// "add_generation_prompt", "enable_thinking", "preserve_thinking", "add_vision_id"}.
// Message content may be a string, null or a list of {"type":"text"|"image"|"video"} parts;
// tool_call arguments may be an object or a JSON string. Flavor is left as given in `defaults`.
struct ParsedRenderInput {
  Conversation conversation;
  RenderOptions options;
  std::string error;  // names the field at fault, e.g. "messages[2].role: unknown role 'bot'"
  bool ok() const { return error.empty(); }
};
ParsedRenderInput parse_render_input(const Json& input, RenderOptions defaults = {});

// Which flavour a chat_template text is (qwen3_6 when it mentions preserve_thinking).
TemplateFlavor detect_flavor(std::string_view chat_template_text);

// Incremental render. `session_text` is everything the session already holds: an earlier
// render's text plus the text of the tokens generated since (normally ending in "<|im_end|>").
// Returns the text to append so that session_text + text == render_chat(conversation, options).
// Fails, with the byte offset where they first differ, when the full render does not extend
// session_text (e.g. the template dropped old reasoning because preserve_thinking is off).
struct IncrementalRender {
  std::string text;
  std::vector<TextSpan> literal_spans;  // of `text` (see RenderResult)
  std::vector<TokenId> tokens;  // filled by render_incremental_tokens only
  std::string error;
  std::size_t diverged_at = 0;  // valid when error is set
  bool ok() const { return error.empty(); }
};
IncrementalRender render_incremental(std::string_view session_text,
                                     const Conversation& conversation,
                                     const RenderOptions& options);
// The same, tokenized. Token equality (session tokens + these == encode(full render)) holds
// because the appended text starts right after an added token; when session_text does not end
// in one (e.g. generation stopped mid-text) this fails rather than risk a BPE merge across the
// boundary.
IncrementalRender render_incremental_tokens(const Tokenizer& tokenizer,
                                            std::string_view session_text,
                                            const Conversation& conversation,
                                            const RenderOptions& options);

// The spans that overlap [from, to), clipped and made relative to `from`: the literal spans of
// a slice of a render.
std::vector<TextSpan> spans_from(std::span<const TextSpan> spans, std::size_t from, std::size_t to);

std::string_view role_name(Role role);

}  // namespace kiln::engine
