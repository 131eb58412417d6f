// The tool-call parser on well-formed output (whole, split at every byte, random chunks), the
// JSON form, and malformed output that must produce a precise error and never throw.
#include <gtest/gtest.h>

#include <random>

#include "engine/chat/tool_call_parser.h"

namespace kiln::engine {
namespace {

std::vector<Json> tools() {
  return {
      Json::parse(R"({"type": "function", "function": {"name": "shell", "parameters": {"type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}, "required": ["command"]}}})"),
      Json::parse(R"({"type": "function", "function": {"name": "str_replace_editor", "parameters": {"type": "object",
        "properties": {"command": {"type": "string", "enum": ["view", "create", "str_replace"]},
                       "path": {"type": "string"}, "view_range": {"type": "array", "items": {"type": "integer"}},
                       "old_str": {"type": "string"}, "new_str": {"type": "string"}},
        "required": ["command", "path"]}}})"),
      Json::parse(R"({"name": "configure", "parameters": {"type": "object",
        "properties": {"enabled": {"type": "boolean"}, "ratio": {"type": "number"}, "meta": {"type": "object"},
                       "note": {"type": ["string", "null"]}, "level": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "required": ["enabled"]}})"),
  };
}

const std::string kWellFormed =
    "I should look at the file.\nThen fix it — carefully.\n</think>\n\n"
    "Let me check the code.\n\n"
    "<tool_call>\n<function=shell>\n<parameter=command>\ncat -n src/a.py\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=str_replace_editor>\n<parameter=command>\nstr_replace\n</parameter>\n"
    "<parameter=path>\n/repo/a.py\n</parameter>\n<parameter=old_str>\n    return a - b\n"
    "</parameter>\n<parameter=new_str>\ns = \"</parameter>\"  # a tag inside code\n    return a + b\n"
    "</parameter>\n<parameter=view_range>\n[1, 20]\n</parameter>\n</function>\n</tool_call>";

void expect_well_formed(const ParsedOutput& out) {
  EXPECT_TRUE(out.errors.empty()) << out.errors.front().message;
  EXPECT_EQ(out.reasoning, "I should look at the file.\nThen fix it — carefully.");
  EXPECT_EQ(out.content, "Let me check the code.");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "shell");
  EXPECT_EQ(out.tool_calls[0].arguments, Json::parse(R"({"command": "cat -n src/a.py", "timeout": 30})"));
  EXPECT_TRUE(out.tool_calls[0].arguments["timeout"].is_number_integer());
  EXPECT_EQ(out.tool_calls[1].name, "str_replace_editor");
  EXPECT_EQ(out.tool_calls[1].arguments["old_str"], "    return a - b");
  EXPECT_EQ(out.tool_calls[1].arguments["new_str"], "s = \"</parameter>\"  # a tag inside code\n    return a + b");
  EXPECT_EQ(out.tool_calls[1].arguments["view_range"], Json::parse("[1, 20]"));
  EXPECT_EQ(out.tool_calls[1].call_index, 1u);
}

TEST(ToolCallParser, WellFormedWhole) { expect_well_formed(parse_model_output(kWellFormed, tools())); }

TEST(ToolCallParser, WellFormedSplitAtEveryByteBoundary) {
  for (std::size_t k = 0; k <= kWellFormed.size(); ++k) {
    ToolCallParser p(tools());
    p.feed(std::string_view(kWellFormed).substr(0, k));
    p.feed(std::string_view(kWellFormed).substr(k));
    p.finish();
    SCOPED_TRACE("split at " + std::to_string(k));
    expect_well_formed(p.total());
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(ToolCallParser, WellFormedByteByByteAndRandomChunks) {
  ToolCallParser bytes(tools());
  std::size_t calls_seen = 0;
  for (char c : kWellFormed) {
    const ParsedOutput delta = bytes.feed(std::string_view(&c, 1));
    calls_seen += delta.tool_calls.size();
  }
  calls_seen += bytes.finish().tool_calls.size();
  EXPECT_EQ(calls_seen, 2u);
  expect_well_formed(bytes.total());
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    ToolCallParser p(tools());
    for (std::size_t i = 0; i < kWellFormed.size();) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 17)(rng);
      p.feed(std::string_view(kWellFormed).substr(i, n));
      i += n;
    }
    p.finish();
    expect_well_formed(p.total());
  }
}

TEST(ToolCallParser, ReasoningAndContentStreamBeforeTheEnd) {
  ToolCallParser p(tools());
  ParsedOutput a = p.feed("Thinking about it");
  EXPECT_EQ(a.reasoning, "Thinking about it");
  ParsedOutput b = p.feed("\n</think>\n\nHello <tool_c");
  EXPECT_EQ(b.content, "Hello");  // the partial tag and the space before it are held
  ParsedOutput c = p.feed("all>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.content, "");
}

TEST(ToolCallParser, ThinkingOffAndRepeatedThinkTag) {
  ToolCallParserOptions off;
  off.starts_in_reasoning = false;
  ParsedOutput o = parse_model_output("Just an answer.", tools(), off);
  EXPECT_EQ(o.content, "Just an answer.");
  EXPECT_EQ(o.reasoning, "");
  EXPECT_TRUE(o.errors.empty());
  // A model that opens <think> although the prompt did not (or repeats it) is still split.
  ParsedOutput t = parse_model_output("<think>\nhmm\n</think>\n\nok", tools(), off);
  EXPECT_EQ(t.reasoning, "hmm");
  EXPECT_EQ(t.content, "ok");
  ParsedOutput r = parse_model_output("<think>\nhmm\n</think>\n\nok", tools());
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok");
}

TEST(ToolCallParser, TypesFollowTheSchema) {
  ParsedOutput o = parse_model_output(
      "</think><tool_call>\n<function=configure>\n<parameter=enabled>\nTrue\n</parameter>\n"
      "<parameter=ratio>\n2.5e-1\n</parameter>\n<parameter=meta>\n{\"a\": [1, {\"b\": null}]}\n</parameter>\n"
      "<parameter=note>\nnull\n</parameter>\n<parameter=level>\n7\n</parameter>\n</function>\n</tool_call>",
      tools());
  ASSERT_TRUE(o.errors.empty()) << o.errors[0].message;
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].arguments,
            Json::parse(R"({"enabled": true, "ratio": 0.25, "meta": {"a": [1, {"b": null}]}, "note": null, "level": 7})"));
  // Multi-line strings keep inner newlines and indentation; only the framing newlines go.
  ParsedOutput s = parse_model_output(
      "</think><tool_call>\n<function=shell>\n<parameter=command>\n\n  echo 1\n  echo 2\n\n</parameter>\n</function>\n</tool_call>",
      tools());
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0].arguments["command"], "\n  echo 1\n  echo 2\n");
}

TEST(ToolCallParser, JsonFormOfOlderQwenModels) {
  ParsedOutput o = parse_model_output(
      "</think>\n\n<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"ls -la\", \"timeout\": \"10\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"configure\", \"arguments\": \"{\\\"enabled\\\": false}\"}\n</tool_call>",
      tools());
  ASSERT_TRUE(o.errors.empty()) << o.errors[0].message;
  ASSERT_EQ(o.tool_calls.size(), 2u);
  EXPECT_EQ(o.tool_calls[0].arguments, Json::parse(R"({"command": "ls -la", "timeout": 10})"));
  EXPECT_EQ(o.tool_calls[1].arguments, Json::parse(R"({"enabled": false})"));
}

TEST(ToolCallParser, BareFunctionWithoutToolCallTag) {
  ParsedOutput o = parse_model_output(
      "</think>\n\n<function=shell>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>", tools());
  ASSERT_TRUE(o.errors.empty()) << o.errors[0].message;
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].arguments["command"], "pwd");
  EXPECT_EQ(o.content, "");
}

TEST(ToolCallParser, WithoutToolsAnyFunctionIsAcceptedUntyped) {
  ParsedOutput o = parse_model_output(
      "</think><tool_call>\n<function=anything>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello world\n</parameter>\n</function>\n</tool_call>",
      {});
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].arguments, Json::parse(R"({"n": 42, "s": "hello world"})"));
}

struct Malformed {
  const char* name;
  std::string output;  // after </think>
  ParseErrorKind kind;
  const char* message_part;  // the error message must name this
};

std::string call(const std::string& fn, const std::string& params) {
  return "<tool_call>\n<function=" + fn + ">\n" + params + "</function>\n</tool_call>";
}
std::string param(const std::string& name, const std::string& value) {
  return "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
}

std::vector<Malformed> malformed_cases() {
  using K = ParseErrorKind;
  const std::string ok_cmd = param("command", "ls");
  return {
      // (a whole <function> at the end without </tool_call> is a call: AWholeFunctionWithout…)
      {"unclosed_tool_call_mid_param", "<tool_call>\n<function=shell>\n<parameter=command>\nls", K::unclosed_tag, "</tool_call>"},
      {"unclosed_parameter", "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</function>\n</tool_call>", K::unclosed_tag, "<parameter=command>"},
      {"missing_function_close", "<tool_call>\n<function=shell>\n" + ok_cmd + "</tool_call>", K::unclosed_tag, "</function>"},
      {"unclosed_bare_function", "<function=shell>\n" + ok_cmd, K::unclosed_tag, "</function>"},
      {"unclosed_think", "", K::unclosed_tag, "</think>"},  // special-cased below: no </think>
      {"unknown_function", call("rm_rf", ok_cmd), K::unknown_function, "rm_rf"},
      {"unknown_function_json", "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", K::unknown_function, "nope"},
      {"missing_required", call("str_replace_editor", param("command", "view")), K::missing_parameter, "'path'"},
      {"missing_required_json", "<tool_call>\n{\"name\": \"shell\", \"arguments\": {}}\n</tool_call>", K::missing_parameter, "'command'"},
      {"integer_not_a_number", call("shell", ok_cmd + param("timeout", "soon")), K::wrong_type, "timeout"},
      {"integer_with_fraction", call("shell", ok_cmd + param("timeout", "1.5")), K::wrong_type, "integer"},
      {"integer_trailing_junk", call("shell", ok_cmd + param("timeout", "12abc")), K::wrong_type, "timeout"},
      {"boolean_yes", call("configure", param("enabled", "yes")), K::wrong_type, "boolean"},
      {"number_text", call("configure", param("enabled", "true") + param("ratio", "half")), K::wrong_type, "ratio"},
      {"array_bad_json", call("str_replace_editor", param("command", "view") + param("path", "/a") + param("view_range", "[1, 2")), K::wrong_type, "view_range"},
      {"object_given_array", call("configure", param("enabled", "false") + param("meta", "[1]")), K::wrong_type, "meta"},
      {"enum_violation", call("str_replace_editor", param("command", "delete") + param("path", "/a")), K::wrong_type, "one of"},
      {"json_wrong_type", "<tool_call>\n{\"name\": \"configure\", \"arguments\": {\"enabled\": \"maybe\"}}\n</tool_call>", K::wrong_type, "enabled"},
      {"unknown_parameter", call("shell", ok_cmd + param("cwd", "/tmp")), K::unknown_parameter, "cwd"},
      {"duplicate_parameter", call("shell", ok_cmd + ok_cmd), K::duplicate_parameter, "command"},
      {"text_before_function", "<tool_call>\nsure: <function=shell>\n" + ok_cmd + "</function>\n</tool_call>", K::malformed, "<function=NAME>"},
      {"function_tag_unterminated", "<tool_call>\n<function=shell\n" + ok_cmd + "</function>\n</tool_call>", K::malformed, "'>'"},
      {"empty_function_name", call("", ok_cmd), K::malformed, "empty function name"},
      {"text_between_parameters", call("shell", ok_cmd + "and also\n"), K::malformed, "and also"},
      {"text_after_function", "<tool_call>\n<function=shell>\n" + ok_cmd + "</function>\ntrailing\n</tool_call>", K::malformed, "trailing"},
      {"json_invalid", "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": }\n</tool_call>", K::malformed, "JSON"},
      {"json_no_name", "<tool_call>\n{\"arguments\": {\"command\": \"ls\"}}\n</tool_call>", K::malformed, "name"},
      {"json_arguments_not_object", "<tool_call>\n{\"name\": \"shell\", \"arguments\": [1]}\n</tool_call>", K::malformed, "arguments"},
      {"empty_tool_call", "<tool_call>\n</tool_call>", K::malformed, "<function=NAME>"},
  };
}

TEST(ToolCallParser, MalformedOutputsGivePreciseErrors) {
  const auto cases = malformed_cases();
  ASSERT_GE(cases.size(), 20u);
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    const bool think_case = std::string(c.name) == "unclosed_think";
    const std::string text = think_case ? "still thinking when the output stopped" : "</think>\n\n" + c.output;
    ParsedOutput out;
    EXPECT_NO_THROW(out = parse_model_output(text, tools()));
    ASSERT_EQ(out.errors.size(), 1u) << (out.errors.empty() ? "" : out.errors[1].message);
    EXPECT_EQ(out.errors[0].kind, c.kind) << out.errors[0].message;
    EXPECT_NE(out.errors[0].message.find(c.message_part), std::string::npos) << out.errors[0].message;
    EXPECT_TRUE(out.tool_calls.empty());
    // The same result however the text is streamed.
    ToolCallParser p(tools());
    for (char ch : text) p.feed(std::string_view(&ch, 1));
    p.finish();
    ASSERT_EQ(p.total().errors.size(), 1u);
    EXPECT_EQ(p.total().errors[0].message, out.errors[0].message);
  }
}

TEST(ToolCallParser, ParsingContinuesAfterABadCall) {
  const ParsedOutput o = parse_model_output(
      "</think>\n\n" + call("nope", param("x", "1")) + "\n" + call("shell", param("command", "ls")), tools());
  ASSERT_EQ(o.errors.size(), 1u);
  EXPECT_EQ(o.errors[0].call_index, 0u);
  EXPECT_EQ(o.errors[0].function, "nope");
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.tool_calls[0].call_index, 1u);
  EXPECT_EQ(o.tool_calls[0].arguments["command"], "ls");
}

TEST(ToolCallParser, RandomGarbageNeverThrowsAndKeepsAllText) {
  std::mt19937 rng(11);
  const std::vector<std::string> atoms = {"<tool_call>", "</tool_call>", "<function=", "shell", ">",
                                          "</function>", "<parameter=", "command", "</parameter>",
                                          "\n", " ", "{", "}", "\"", "x", "</think>", "<think>", "é"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, 30)(rng);
    for (int i = 0; i < n; ++i) text += atoms[std::uniform_int_distribution<std::size_t>(0, atoms.size() - 1)(rng)];
    ParsedOutput whole;
    EXPECT_NO_THROW(whole = parse_model_output(text, tools()));
    ToolCallParser p(tools());
    for (char ch : text) p.feed(std::string_view(&ch, 1));
    p.finish();
    EXPECT_EQ(p.total().reasoning, whole.reasoning) << text;
    EXPECT_EQ(p.total().content, whole.content) << text;
    EXPECT_EQ(p.total().tool_calls.size(), whole.tool_calls.size()) << text;
    EXPECT_EQ(p.total().errors.size(), whole.errors.size()) << text;
  }
}


// Output fed whole and one byte at a time must parse the same.
std::vector<ParsedOutput> whole_and_bytewise(const std::string& text) {
  ParsedOutput bytewise;
  {
    ToolCallParser p(tools(), {true});
    for (char c : text) p.feed(std::string_view(&c, 1));
    p.finish();
    bytewise = p.total();
  }
  return {parse_model_output(text, tools(), {true}), bytewise};
}

// A value may contain "</parameter>" and then "</tool_call>" (code that handles these tags): only
// a </parameter> followed by <parameter= or </function> closes it, so the call is not cut short.
TEST(ToolCallParser, CloseTagsInsideAValueDoNotEndTheCall) {
  const std::string text =
      "Plan.\n</think>\n\n<tool_call>\n<function=str_replace_editor>\n<parameter=command>\ncreate\n</parameter>\n"
      "<parameter=path>\ntags.py\n</parameter>\n<parameter=new_str>\n"
      "CLOSE_TAGS = [\"</parameter>\", \"</function>\", \"</tool_call>\"]\n</parameter>\n</function>\n</tool_call>";
  for (const ParsedOutput& out : whole_and_bytewise(text)) {
    EXPECT_TRUE(out.errors.empty()) << out.errors.front().message;
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].arguments["new_str"], "CLOSE_TAGS = [\"</parameter>\", \"</function>\", \"</tool_call>\"]");
    EXPECT_EQ(out.content, "");
  }
}

TEST(ToolCallParser, JsonFormStringsMayContainTheCloseTag) {
  const std::string text =
      "ok\n</think>\n\n<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"echo \\\"</tool_call>\\\" {\"}}\n"
      "</tool_call>\nDone.";
  for (const ParsedOutput& out : whole_and_bytewise(text)) {
    EXPECT_TRUE(out.errors.empty()) << out.errors.front().message;
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].arguments["command"], "echo \"</tool_call>\" {");
    EXPECT_EQ(out.content, "Done.");
  }
}

TEST(ToolCallParser, AWholeFunctionWithoutClosingToolCallAtTheEndIsACall) {
  const std::string text = "ok\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n";
  for (const ParsedOutput& out : whole_and_bytewise(text)) {
    EXPECT_TRUE(out.errors.empty()) << out.errors.front().message;
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].arguments["command"], "ls");
  }
  // Cut inside the function it is still an error naming the unclosed tag.
  const ParsedOutput cut = parse_model_output("</think>\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n", tools(), {true});
  EXPECT_TRUE(cut.tool_calls.empty());
  ASSERT_FALSE(cut.errors.empty());
}


TEST(ToolCallParser, TwoFunctionsInOneToolCallAreTwoCalls) {
  const std::string text =
      "ok\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n"
      "<function=shell>\n<parameter=command>\necho \"</function>\"\n</parameter>\n</function>\n</tool_call>";
  for (const ParsedOutput& out : whole_and_bytewise(text)) {
    EXPECT_TRUE(out.errors.empty()) << out.errors.front().message;
    ASSERT_EQ(out.tool_calls.size(), 2u);
    EXPECT_EQ(out.tool_calls[0].arguments["command"], "ls");
    EXPECT_EQ(out.tool_calls[1].arguments["command"], "echo \"</function>\"");
    EXPECT_EQ(out.tool_calls[1].call_index, 1u);
  }
}


// A call missing its </function> is an error for the model, and the next call is still read: the
// value does not run on into it (which would run the rest of the turn as a command).
TEST(ToolCallParser, AMissingFunctionCloseDoesNotSwallowTheNextCall) {
  const std::string text =
      "ok\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</tool_call>\n"
      "<tool_call>\n<function=shell>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>";
  for (const ParsedOutput& out : whole_and_bytewise(text)) {
    ASSERT_EQ(out.errors.size(), 1u);
    EXPECT_NE(out.errors[0].message.find("</function>"), std::string::npos) << out.errors[0].message;
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].arguments["command"], "pwd");
  }
}

}  // namespace
}  // namespace kiln::engine
