#include "agent/scripted_chat_model.h"

#include <gtest/gtest.h>

namespace kiln::agent {
namespace {

TEST(ScriptedChatModel, prefill_counts_only_new_tokens) {
  ScriptedTurn t1{.reasoning = "look first", .calls = {{"", "view", Json{{"path", "."}}}}};
  ScriptedTurn t2{.text = "done", .calls = {{"", "submit", Json{{"summary", "ok"}}}}};
  ScriptedChatModel model({t1, t2});
  std::vector<ToolSchema> tools{{"view", "show a file", Json{{"type", "object"}}}};
  std::vector<Message> conv{make_message(Role::system, "system prompt"), make_message(Role::user, "task")};
  std::atomic<bool> cancel{false};

  auto first = model.next_turn({conv, tools, 1000}, nullptr, cancel);
  ASSERT_EQ(first.end, TurnEnd::stop);
  EXPECT_EQ(first.usage.reused_tokens, 0);
  EXPECT_EQ(first.usage.prefilled_tokens, *model.prompt_tokens(conv, tools));
  conv.push_back(first.message);
  conv.push_back(tool_message(std::string(100, 'x'), "call_1_0", "view"));

  auto second = model.next_turn({conv, tools, 1000}, nullptr, cancel);
  int64_t total = *model.prompt_tokens(conv, tools);
  EXPECT_EQ(second.usage.reused_tokens, first.usage.context_tokens);  // the whole first turn is cached
  EXPECT_EQ(second.usage.prefilled_tokens + second.usage.reused_tokens, total);
  // Each token is prefilled once: prefilled + generated adds up to the context, not more.
  EXPECT_EQ(first.usage.prefilled_tokens + second.usage.prefilled_tokens + first.usage.generated_tokens, total);
  EXPECT_EQ(model.shown().size(), 2u);
}

TEST(ScriptedChatModel, stops_at_max_new_tokens_and_on_cancel) {
  ScriptedTurn long_turn{.reasoning = std::string(400, 'r'), .calls = {{"", "view", Json::object()}}};
  ScriptedChatModel model({long_turn, long_turn});
  std::vector<ToolSchema> tools;
  std::vector<Message> conv{make_message(Role::system, "s"), make_message(Role::user, "t")};
  std::atomic<bool> cancel{false};
  auto cut = model.next_turn({conv, tools, 10}, nullptr, cancel);
  EXPECT_EQ(cut.end, TurnEnd::length);
  EXPECT_EQ(cut.usage.generated_tokens, 10);
  EXPECT_TRUE(cut.message.tool_calls.empty());
  cancel = true;
  auto cancelled = model.next_turn({conv, tools, 1000}, nullptr, cancel);
  EXPECT_EQ(cancelled.end, TurnEnd::cancelled);
}

TEST(ScriptedChatModel, exhausted_script_is_an_error_not_a_crash) {
  ScriptedChatModel model({});
  std::vector<ToolSchema> tools;
  std::vector<Message> conv{make_message(Role::system, "s"), make_message(Role::user, "t")};
  std::atomic<bool> cancel{false};
  auto turn = model.next_turn({conv, tools, 100}, nullptr, cancel);
  EXPECT_EQ(turn.end, TurnEnd::error);
  EXPECT_NE(turn.error.find("exhausted"), std::string::npos);
}

}  // namespace
}  // namespace kiln::agent
