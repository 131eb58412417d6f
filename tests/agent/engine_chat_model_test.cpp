// EngineChatModel on a real (random-weight) make-tiny model with the tiny Qwen tokenizer.
#include "agent/engine_chat_model.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace kiln::agent {
namespace {

using testing::TinyEngine;

std::vector<ToolSchema> tools() {
  return {{"bash", "Run a command.",
           Json{{"type", "object"},
                {"properties", {{"command", {{"type", "string"}}}}},
                {"required", {"command"}}}}};
}

TEST(EngineChatModel, thirty_turns_prefill_each_token_once) {
  TinyEngine tiny;
  ASSERT_TRUE(tiny.model && tiny.tokenizer);
  EngineChatModelOptions options;
  options.sampling.seed = 7;
  options.sampling.temperature = 1.0f;
  auto opened = EngineChatModel::open(*tiny.model, *tiny.tokenizer, "tiny", options);
  ASSERT_TRUE(opened.ok()) << opened.error();
  EngineChatModel& model = *opened.value();
  std::vector<Message> conv{make_message(Role::system, "You are kiln. Fix the bug."),
                            make_message(Role::user, "median() is wrong for even lengths.")};
  std::atomic<bool> cancel{false};
  int64_t prefilled = 0, generated = 0, all_turn_contexts = 0;
  for (int turn = 0; turn < 30; ++turn) {
    auto expected = model.prompt_tokens(conv, tools());
    ASSERT_TRUE(expected.ok()) << expected.error();
    auto t = model.next_turn({conv, tools(), 6}, nullptr, cancel);
    ASSERT_NE(t.end, TurnEnd::error) << t.error;
    EXPECT_EQ(t.usage.reused_tokens + t.usage.prefilled_tokens, *expected) << "turn " << turn;
    if (turn > 0) {  // the whole session before this turn was reused
      EXPECT_EQ(t.usage.reused_tokens, model.session().size() - t.usage.generated_tokens - t.usage.prefilled_tokens);
    }
    prefilled += t.usage.prefilled_tokens;
    generated += t.usage.generated_tokens;
    all_turn_contexts += t.usage.context_tokens;
    EXPECT_EQ(t.usage.context_tokens, model.session().size());
    conv.push_back(t.message);
    for (size_t i = 0; i < conv.back().tool_calls.size(); ++i)  // as the loop does
      conv.back().tool_calls[i].id = "call_" + std::to_string(turn) + "_" + std::to_string(i);
    conv.push_back(tool_message("[exit code 1]\nFAIL: test_median_even (turn " + std::to_string(turn) + ")",
                                "call_" + std::to_string(turn), "bash"));
  }
  RecordProperty("tokens_prefilled", std::to_string(prefilled));
  RecordProperty("tokens_generated", std::to_string(generated));
  RecordProperty("session_tokens", std::to_string(model.session().size()));
  RecordProperty("sum_of_turn_contexts", std::to_string(all_turn_contexts));
  // Every token in the session was prefilled or generated exactly once.
  EXPECT_EQ(prefilled + generated, model.session().size());
  EXPECT_LT(prefilled, all_turn_contexts / 10);  // far less than re-prefilling every turn
  EXPECT_EQ(model.rebuilds(), 0);
}

TEST(EngineChatModel, compacted_conversation_rewinds_to_the_task_and_prefills_once) {
  TinyEngine tiny;
  ASSERT_TRUE(tiny.model && tiny.tokenizer);
  auto opened = EngineChatModel::open(*tiny.model, *tiny.tokenizer, "tiny");
  ASSERT_TRUE(opened.ok()) << opened.error();
  EngineChatModel& model = *opened.value();
  std::vector<Message> conv{make_message(Role::system, "sys"), make_message(Role::user, "task")};
  std::atomic<bool> cancel{false};
  auto first = model.next_turn({conv, tools(), 4}, nullptr, cancel);
  ASSERT_NE(first.end, TurnEnd::error) << first.error;
  conv.push_back(first.message);
  conv.push_back(tool_message(std::string(2000, 'x'), "call_1_0", "bash"));
  auto second = model.next_turn({conv, tools(), 4}, nullptr, cancel);
  ASSERT_NE(second.end, TurnEnd::error) << second.error;
  int64_t before = model.session().size();

  conv.back().content = "[output removed]";  // what compaction does to old outputs
  auto needed = model.prompt_tokens(conv, tools());
  ASSERT_TRUE(needed.ok());
  EXPECT_LT(*needed, before);
  auto third = model.next_turn({conv, tools(), 4}, nullptr, cancel);
  ASSERT_NE(third.end, TurnEnd::error) << third.error;
  EXPECT_EQ(model.rebuilds(), 1);
  EXPECT_EQ(third.usage.reused_tokens + third.usage.prefilled_tokens, *needed);
  EXPECT_LT(third.usage.reused_tokens, first.usage.reused_tokens + first.usage.prefilled_tokens);
}

TEST(EngineChatModel, cancel_stops_generation_after_one_token) {
  TinyEngine tiny;
  ASSERT_TRUE(tiny.model && tiny.tokenizer);
  auto opened = EngineChatModel::open(*tiny.model, *tiny.tokenizer, "tiny");
  ASSERT_TRUE(opened.ok());
  std::vector<Message> conv{make_message(Role::system, "sys"), make_message(Role::user, "task")};
  std::atomic<bool> cancel{true};
  auto t = (*opened)->next_turn({conv, tools(), 500}, nullptr, cancel);
  EXPECT_EQ(t.end, TurnEnd::cancelled);
  EXPECT_LE(t.usage.generated_tokens, 1);
}

}  // namespace
}  // namespace kiln::agent
