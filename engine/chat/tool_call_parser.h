// Parses the model's output stream into reasoning, visible text and tool calls.
//
// Accepted forms (Qwen3-Coder / Qwen3.5 / Qwen3.6):
//   {reasoning}</think>\n\n{content}<tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>
//   \n</function>\n</tool_call>
// and the older JSON form <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>.
// Parameter values are typed by the tool's JSON schema (strings raw; integer, number, boolean,
// null, object and array parsed), like vLLM's qwen3_coder parser, but strictly: a value that does
// not fit its type is an error, not a silent string.
//
// The parser never throws. A malformed call is reported as a ParseError whose message is meant to
// be sent back to the model (it names the tag, function or parameter at fault); parsing goes on
// after it. Owned by one thread (one parser per generated turn).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"

namespace kiln::engine {

enum class ParseErrorKind {
  unclosed_tag,        // <tool_call>, <function=…>, <parameter=…> or <think> never closed
  unknown_function,    // no tool with that name
  missing_parameter,   // a required parameter is absent
  wrong_type,          // value does not fit the schema type (or enum)
  unknown_parameter,   // parameter not in the schema's properties
  duplicate_parameter,
  malformed,           // anything else: stray text inside <tool_call>, bad JSON form, …
};

std::string_view parse_error_kind_name(ParseErrorKind kind);

struct ParseError {
  ParseErrorKind kind = ParseErrorKind::malformed;
  std::string message;    // one line, for the model: "tool call 1 (edit): missing required …"
  std::string function;   // when known
  std::string parameter;  // when relevant
  std::size_t call_index = 0;  // 0-based index of the <tool_call> block in this output
};

struct ParsedToolCall {
  std::string name;
  Json arguments = Json::object();  // in the order the model wrote them
  std::size_t call_index = 0;
};

// What one feed()/finish() call produced (deltas), or the whole output (ToolCallParser::total()).
struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  std::vector<ParseError> errors;
  void append(const ParsedOutput& other);
};

struct ToolCallParserOptions {
  // True when the prompt ended with "<think>\n" (thinking on): output starts inside reasoning.
  bool starts_in_reasoning = true;
};

class ToolCallParser {
 public:
  // `tools`: the same tool objects given to the chat template ({"type":"function","function":
  // {"name","parameters"}} or bare {"name","parameters"}). With no tools, any function name is
  // accepted and values are typed by their look (JSON if it parses, else string).
  explicit ToolCallParser(std::vector<Json> tools, ToolCallParserOptions options = {});

  // Feed the next piece of decoded text (any split, even inside a tag or a UTF-8 character).
  ParsedOutput feed(std::string_view chunk);
  // End of output: flushes held text and reports unclosed tags.
  ParsedOutput finish();
  // Everything produced so far.
  const ParsedOutput& total() const { return total_; }

 private:
  enum class State { reasoning, content, tool_call };
  void step(ParsedOutput& out, bool final);
  void emit_content(ParsedOutput& out, std::string_view text, bool final);
  void finish_call(ParsedOutput& out, std::string_view body, bool bare_function);

  std::vector<Json> tools_;
  ToolCallParserOptions options_;
  State state_;
  std::string buffer_;            // unconsumed input
  std::string held_whitespace_;   // content whitespace held until non-space text follows
  bool content_started_ = false;  // non-space content emitted (leading whitespace is dropped)
  bool reasoning_started_ = false;
  bool bare_function_ = false;  // current call began with <function= (no <tool_call>)
  bool finished_ = false;
  std::size_t call_count_ = 0;
  ParsedOutput total_;
};

// One-shot convenience: feed(text) + finish().
ParsedOutput parse_model_output(std::string_view text, const std::vector<Json>& tools,
                                ToolCallParserOptions options = {});

}  // namespace kiln::engine
