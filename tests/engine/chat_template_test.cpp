// The C++ chat template against prompts rendered by real Jinja implementations
// (../shared/assets/chat), and its error cases.
#include <gtest/gtest.h>

#include "engine/chat/chat_template.h"
#include "tests/engine/tokenizer_test_fixtures.h"

namespace kiln::engine {
namespace {

using testing::read_all;
using testing::shared_path;

ParsedRenderInput load_case(const std::string& name) {
  const Json input = Json::parse(read_all(shared_path("assets/chat/" + name + ".input.json")));
  return parse_render_input(input);
}

class ChatTemplateFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatTemplateFixture, RendersByteIdenticalToJinja) {
  const std::string name = GetParam();
  ParsedRenderInput in = load_case(name);
  ASSERT_TRUE(in.ok()) << in.error;
  in.options.flavor = TemplateFlavor::qwen3_6;
  RenderResult r = render_chat(in.conversation, in.options);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.text, read_all(shared_path("assets/chat/" + name + ".prompt.txt")));
}

TEST_P(ChatTemplateFixture, Qwen35FlavorDiffersOnlyWherePreserveThinkingMatters) {
  const std::string name = GetParam();
  ParsedRenderInput in = load_case(name);
  ASSERT_TRUE(in.ok()) << in.error;
  in.options.flavor = TemplateFlavor::qwen3_5;
  RenderResult r = render_chat(in.conversation, in.options);
  ASSERT_TRUE(r.ok()) << r.error;
  const std::string expected = read_all(shared_path("assets/chat/" + name + ".prompt.txt"));
  if (name == "d2-multiturn-preserve-thinking") {
    EXPECT_NE(r.text, expected);  // 3.5 has no preserve_thinking: earlier reasoning is dropped
    EXPECT_EQ(r.text, read_all(shared_path("assets/chat/d1-multiturn-default.prompt.txt")));
  } else {
    EXPECT_EQ(r.text, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedAssets, ChatTemplateFixture,
                         ::testing::Values("a-system-user", "b-tools-agent",
                                           "c-tools-agent-no-thinking", "d1-multiturn-default",
                                           "d2-multiturn-preserve-thinking"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

ChatMessage msg(Role role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

Conversation simple(std::vector<ChatMessage> msgs) {
  Conversation c;
  c.messages = std::move(msgs);
  return c;
}

TEST(ChatTemplate, ArgumentSerialisationDiffersByFlavor) {
  ChatMessage user = msg(Role::user, "go");
  ChatMessage asst = msg(Role::assistant, "");
  asst.tool_calls.push_back(ToolCall{"f", Json::parse(R"({"flag": true, "n": 3, "x": 1.5, "none": null, "s": "raw \"text\"", "l": [1, "a"], "o": {"k": false}})"), ""});
  RenderOptions o;
  o.add_generation_prompt = false;
  const std::string r36 = render_chat(simple({user, asst}), o).text;
  EXPECT_NE(r36.find("<parameter=flag>\ntrue\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r36.find("<parameter=none>\nnull\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r36.find("<parameter=s>\nraw \"text\"\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r36.find("<parameter=l>\n[1, \"a\"]\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r36.find("<parameter=o>\n{\"k\": false}\n</parameter>\n"), std::string::npos);
  o.flavor = TemplateFlavor::qwen3_5;
  const std::string r35 = render_chat(simple({user, asst}), o).text;
  EXPECT_NE(r35.find("<parameter=flag>\nTrue\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r35.find("<parameter=none>\nNone\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r35.find("<parameter=x>\n1.5\n</parameter>\n"), std::string::npos);
  EXPECT_NE(r35.find("<parameter=o>\n{\"k\": false}\n</parameter>\n"), std::string::npos);
  // Argument order is the order given.
  EXPECT_LT(r36.find("<parameter=flag>"), r36.find("<parameter=n>"));
  EXPECT_LT(r36.find("<parameter=n>"), r36.find("<parameter=x>"));
}

TEST(ChatTemplate, ReasoningIsSplitOutOfContentWhenNotGiven) {
  ChatMessage asst = msg(Role::assistant, "<think>\nplan it\n</think>\n\nThe answer.");
  RenderOptions o;
  o.add_generation_prompt = false;
  const RenderResult r = render_chat(simple({msg(Role::user, "q"), asst}), o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.text,
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nplan it\n</think>\n\n"
            "The answer.<|im_end|>\n");
}

TEST(ChatTemplate, ConsecutiveToolMessagesShareOneUserTurn) {
  ChatMessage asst = msg(Role::assistant, "");
  asst.tool_calls.push_back(ToolCall{"a", Json::object(), ""});
  asst.tool_calls.push_back(ToolCall{"b", Json::object(), ""});
  const RenderResult r = render_chat(
      simple({msg(Role::user, "q"), asst, msg(Role::tool, "  one  "), msg(Role::tool, "two")}), {});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_NE(r.text.find("</function>\n</tool_call>\n<tool_call>\n<function=b>\n</function>\n</tool_call><|im_end|>\n"
                        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
                        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"),
            std::string::npos)
      << r.text;
}

TEST(ChatTemplate, ErrorsMatchTheTemplateExceptions) {
  EXPECT_EQ(render_chat(simple({}), {}).error, "No messages provided.");
  EXPECT_EQ(render_chat(simple({msg(Role::system, "s")}), {}).error, "No user query found in messages.");
  EXPECT_NE(render_chat(simple({msg(Role::user, "q"), msg(Role::system, "late")}), {}).error.find(
                "System message must be at the beginning."),
            std::string::npos);
  // A user turn that is only a wrapped tool response is not a query.
  EXPECT_EQ(render_chat(simple({msg(Role::user, "<tool_response>x</tool_response>")}), {}).error,
            "No user query found in messages.");
}

TEST(ChatTemplate, ParseRenderInputNamesTheFieldAtFault) {
  EXPECT_EQ(parse_render_input(Json::parse(R"({"messages":[{"role":"bot","content":"x"}]})")).error,
            "messages[0].role: Unexpected message role 'bot'.");
  EXPECT_NE(parse_render_input(Json::parse(R"({"messages":[{"role":"user","content":5}]})")).error.find(
                "messages[0].content"),
            std::string::npos);
  EXPECT_NE(parse_render_input(Json::parse(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]})"))
                .error.find("messages[0].tool_calls[0].arguments"),
            std::string::npos);
  // OpenAI-style string arguments and content parts are accepted.
  ParsedRenderInput in = parse_render_input(Json::parse(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"look "},{"type":"image"}]},
          {"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"b\": 1, \"a\": 2}"}}]}],
          "add_generation_prompt": false, "add_vision_id": true})"));
  ASSERT_TRUE(in.ok()) << in.error;
  EXPECT_EQ(in.conversation.messages[0].content, "look Picture 1: <|vision_start|><|image_pad|><|vision_end|>");
  EXPECT_EQ(in.conversation.messages[1].tool_calls[0].arguments.dump(), R"({"b":1,"a":2})");
  EXPECT_FALSE(in.options.add_generation_prompt);
}

TEST(ChatTemplate, DetectsFlavorFromTemplateText) {
  EXPECT_EQ(detect_flavor(read_all(shared_path("assets/chat/qwen3.6-chat_template.jinja"))), TemplateFlavor::qwen3_6);
  EXPECT_EQ(detect_flavor(read_all(shared_path("assets/chat/qwen3.5-chat_template.jinja"))), TemplateFlavor::qwen3_5);
}

}  // namespace
}  // namespace kiln::engine

namespace kiln::engine {
namespace {

TEST(ChatTemplate, ToolsJsonMatchesPythonJsonDumps) {
  // Expected strings are what Python's json.dumps(x, ensure_ascii=False) prints.
  const Json tool = Json::parse(
      R"({"name": "f", "description": "naïve \"quote\" \\ tab\t nl\n ctl\u0001 ✓", "n": [1, -2, 0.5, 1e-05, 0.0001, 1e+16, 1e15, 123456789.125, 100.0, 1234567890123456.7, -1500000000000000.5],
          "b": [true, false, null], "e": {}, "l": []})");
  Conversation c;
  c.tools = {tool};
  ChatMessage user;
  user.content = "hi";
  c.messages = {user};
  const RenderResult r = render_chat(c, {});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_NE(r.text.find(R"({"name": "f", "description": "naïve \"quote\" \\ tab\t nl\n ctl\u0001 ✓", )"
                        R"("n": [1, -2, 0.5, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 123456789.125, 100.0, 1234567890123456.8, -1500000000000000.5], )"
                        R"("b": [true, false, null], "e": {}, "l": []})"),
            std::string::npos)
      << r.text;
}

}  // namespace
}  // namespace kiln::engine
