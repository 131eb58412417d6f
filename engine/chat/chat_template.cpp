// render_chat: a line-by-line restatement of the Qwen3.5/3.6 Jinja template (see README.md).
#include "engine/chat/chat_template.h"

#include "engine/chat/python_text.h"

#include <algorithm>

namespace kiln::engine {

namespace {

constexpr std::string_view kToolsPreamble =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsInstructions =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

// Qwen3.6: strings raw, everything else tojson. Qwen3.5: mappings and lists tojson, other
// values through Python str() (True, None, 1.5).
std::string argument_text(const Json& value, TemplateFlavor flavor) {
  if (value.is_string()) return value.get<std::string>();
  if (flavor == TemplateFlavor::qwen3_6 || value.is_object() || value.is_array())
    return python::dumps(value);
  return python::str(value);
}

// Appends text that came from a message or tool, recording where it lies.
void literal(std::string& out, std::vector<TextSpan>& spans, std::string_view text) {
  if (text.empty()) return;
  if (!spans.empty() && spans.back().end == out.size()) spans.back().end += text.size();
  else spans.push_back({out.size(), out.size() + text.size()});
  out += text;
}

void render_assistant(const ChatMessage& m, bool keep_reasoning, TemplateFlavor flavor,
                      std::string& out, std::vector<TextSpan>& spans) {
  std::string_view content = python::strip(m.content);
  std::string reasoning;
  if (m.reasoning_content) {
    reasoning = *m.reasoning_content;
  } else if (content.find("</think>") != std::string_view::npos) {
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
    std::string_view before = rstrip_newlines(content.substr(0, content.find("</think>")));
    const auto open = before.rfind("<think>");
    if (open != std::string_view::npos) before = before.substr(open + 7);
    reasoning = std::string(lstrip_newlines(before));
    // content.split('</think>')[-1].lstrip('\n')
    content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
  }
  const std::string_view reasoning_trimmed = python::strip(reasoning);
  out += "<|im_start|>assistant\n";
  if (keep_reasoning) {
    out += "<think>\n";
    literal(out, spans, reasoning_trimmed);
    out += "\n</think>\n\n";
  }
  literal(out, spans, content);
  for (std::size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ToolCall& call = m.tool_calls[i];
    if (i == 0) out += python::strip(content).empty() ? "" : "\n\n";
    else out += "\n";
    out += "<tool_call>\n<function=";
    literal(out, spans, call.name);
    out += ">\n";
    if (call.arguments.is_object()) {
      for (auto it = call.arguments.begin(); it != call.arguments.end(); ++it) {
        out += "<parameter=";
        literal(out, spans, it.key());
        out += ">\n";
        literal(out, spans, argument_text(it.value(), flavor));
        out += "\n</parameter>\n";
      }
    }
    out += "</function>\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string_view role_name(Role role) {
  switch (role) {
    case Role::system: return "system";
    case Role::user: return "user";
    case Role::assistant: return "assistant";
    case Role::tool: return "tool";
  }
  return "?";
}

RenderOptions append_only_options(TemplateFlavor flavor, bool enable_thinking) {
  RenderOptions o;
  o.flavor = flavor;
  o.enable_thinking = enable_thinking;
  o.preserve_thinking = true;
  return o;
}

TemplateFlavor detect_flavor(std::string_view chat_template_text) {
  return chat_template_text.empty() ||
                 chat_template_text.find("preserve_thinking") != std::string_view::npos
             ? TemplateFlavor::qwen3_6
             : TemplateFlavor::qwen3_5;
}

RenderResult render_chat(const Conversation& conv, const RenderOptions& options) {
  RenderResult r;
  const auto& msgs = conv.messages;
  if (msgs.empty()) {
    r.error = "No messages provided.";
    return r;
  }
  std::string& out = r.text;
  std::vector<TextSpan>& spans = r.literal_spans;
  const bool first_is_system = msgs[0].role == Role::system;
  if (!conv.tools.empty()) {
    out += kToolsPreamble;
    for (const Json& tool : conv.tools) {
      out += '\n';
      std::string schema;
      python::dumps_to(tool, schema);
      literal(out, spans, schema);
    }
    out += kToolsInstructions;
    if (first_is_system) {
      const std::string_view c = python::strip(msgs[0].content);
      if (!c.empty()) {
        out += "\n\n";
        literal(out, spans, c);
      }
    }
    out += "<|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n";
    literal(out, spans, python::strip(msgs[0].content));
    out += "<|im_end|>\n";
  }

  // The last user message that is a real query (not a wrapped tool response).
  std::size_t last_query = msgs.size() - 1;
  bool found = false;
  for (std::size_t k = msgs.size(); k-- > 0;) {
    if (msgs[k].role != Role::user) continue;
    const std::string_view c = python::strip(msgs[k].content);
    if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = k;
      found = true;
      break;
    }
  }
  if (!found) {
    r.error = "No user query found in messages.";
    return r;
  }

  const bool preserve = options.preserve_thinking && options.flavor == TemplateFlavor::qwen3_6;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    switch (m.role) {
      case Role::system:
        if (i != 0) {
          r.error = "System message must be at the beginning. (messages[" + std::to_string(i) + "])";
          return r;
        }
        break;
      case Role::user:
        out += "<|im_start|>user\n";
        literal(out, spans, python::strip(m.content));
        out += "<|im_end|>\n";
        break;
      case Role::assistant:
        render_assistant(m, preserve || i > last_query, options.flavor, out, spans);
        break;
      case Role::tool:
        if (i > 0 && msgs[i - 1].role != Role::tool) out += "<|im_start|>user";
        out += "\n<tool_response>\n";
        literal(out, spans, python::strip(m.content));
        out += "\n</tool_response>";
        if (i + 1 == msgs.size() || msgs[i + 1].role != Role::tool) out += "<|im_end|>\n";
        break;
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return r;
}

std::vector<TextSpan> spans_from(std::span<const TextSpan> spans, std::size_t from, std::size_t to) {
  std::vector<TextSpan> out;
  for (const TextSpan& s : spans) {
    const std::size_t b = std::max(s.begin, from), e = std::min(s.end, to);
    if (b < e) out.push_back({b - from, e - from});
  }
  return out;
}

IncrementalRender render_incremental(std::string_view session_text, const Conversation& conv,
                                     const RenderOptions& options) {
  IncrementalRender r;
  RenderResult full = render_chat(conv, options);
  if (!full.ok()) {
    r.error = full.error;
    return r;
  }
  const std::string_view f = full.text;
  std::size_t k = 0;
  while (k < session_text.size() && k < f.size() && session_text[k] == f[k]) ++k;
  if (k < session_text.size()) {
    r.diverged_at = k;
    auto around = [](std::string_view s, std::size_t at) {
      return std::string(s.substr(at, 40));
    };
    r.error = "not append-only: the full render differs from the session text at byte " +
              std::to_string(k) + " (session has \"" + around(session_text, k) +
              "\", render has \"" + around(f, k) + "\")" +
              (options.preserve_thinking ? "" : "; render with preserve_thinking=true");
    return r;
  }
  r.text = std::string(f.substr(session_text.size()));
  r.literal_spans = spans_from(full.literal_spans, session_text.size(), f.size());
  return r;
}

IncrementalRender render_incremental_tokens(const Tokenizer& tokenizer,
                                            std::string_view session_text,
                                            const Conversation& conv,
                                            const RenderOptions& options) {
  IncrementalRender r = render_incremental(session_text, conv, options);
  if (!r.ok() || r.text.empty() || session_text.empty()) {
    if (r.ok()) tokenizer.encode_append(r.text, r.tokens, r.literal_spans);
    return r;
  }
  bool at_added_token = false;
  for (const AddedToken& t : tokenizer.added_tokens())
    if (ends_with(session_text, t.content)) at_added_token = true;
  if (!at_added_token) {
    r.diverged_at = session_text.size();
    r.error = "session text does not end with an added token (e.g. <|im_end|>): appending "
              "could change how its last characters tokenize";
    r.text.clear();
    return r;
  }
  tokenizer.encode_append(r.text, r.tokens, r.literal_spans);
  return r;
}

}  // namespace kiln::engine
