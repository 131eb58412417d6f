// Compaction is a pure function of the conversation; these tests pin what it keeps and drops.
#include "agent/compaction.h"

#include <gtest/gtest.h>

namespace kiln::agent {
namespace {

Message assistant_call(const std::string& id, const std::string& tool) {
  Message m = make_message(Role::assistant, "");
  m.reasoning = "thinking about " + id;
  m.tool_calls.push_back({id, tool, Json{{"path", "a.txt"}}});
  return m;
}

std::vector<Message> conversation(int turns) {
  std::vector<Message> c{make_message(Role::system, "sys"), make_message(Role::user, "the task")};
  for (int i = 0; i < turns; ++i) {
    std::string id = "call_" + std::to_string(i);
    c.push_back(assistant_call(id, "view"));
    c.push_back(tool_message(std::string(400, 'a' + i) + "\nline2", id, "view"));
  }
  return c;
}

TEST(Compaction, keeps_system_task_and_recent_turns_and_notes_older_outputs) {
  auto before = conversation(5);
  auto after = compact_conversation(before, 2);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[1], before[1]);
  // Turns 0..2 (entries 2..7): assistant kept, tool output replaced by a one-line note.
  for (size_t i = 2; i < 8; ++i) {
    if (before[i].role == Role::assistant) {
      EXPECT_EQ(after[i], before[i]);
    } else {
      EXPECT_EQ(after[i].content, compaction_note(before[i]));
      EXPECT_EQ(after[i].content.find('\n'), std::string::npos);
      EXPECT_NE(after[i].content.find("view"), std::string::npos);
      EXPECT_NE(after[i].content.find("2 lines"), std::string::npos);
      EXPECT_EQ(after[i].tool_call_id, before[i].tool_call_id);
    }
  }
  for (size_t i = 8; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << i;
}

TEST(Compaction, is_deterministic_and_keep_zero_drops_old_reasoning) {
  auto before = conversation(3);
  EXPECT_EQ(compact_conversation(before, 0), compact_conversation(before, 0));
  auto after = compact_conversation(before, 0);
  const size_t last_result = before.size() - 1;  // the last turn's output, not read by the model yet
  for (size_t i = 2; i < after.size(); ++i) {
    if (after[i].role == Role::assistant) {
      EXPECT_TRUE(after[i].reasoning.empty() || i == last_result - 1);
      EXPECT_EQ(after[i].tool_calls, before[i].tool_calls);
    }
    if (after[i].role == Role::tool && i != last_result) {
      EXPECT_LT(after[i].content.size(), before[i].content.size());
    }
  }
  EXPECT_EQ(after[last_result], before[last_result]);
}

// At keep 0 the unread results of the last turn stay (the model would otherwise run the same
// tools again, get the same output and loop); only when even that does not fit are they cut to
// head and tail. Long arguments of older calls (a create's whole file text) are dropped.
TEST(Compaction, keep_zero_keeps_the_unread_results_and_cuts_them_only_when_asked) {
  auto before = conversation(3);
  before[2].tool_calls[0].arguments["file_text"] = std::string(5000, 'z');
  before.back().content = std::string(3000, 'h') + std::string(3000, 't');
  auto kept = compact_conversation(before, 0);
  EXPECT_EQ(kept.back(), before.back());
  EXPECT_EQ(kept[2].tool_calls[0].arguments["file_text"], "[5000 bytes removed to fit the context]");
  EXPECT_EQ(kept[2].tool_calls[0].arguments["path"], "a.txt");
  auto cut = compact_conversation(before, 0, 1000);
  const std::string& text = cut.back().content;
  EXPECT_LT(text.size(), 1100u);
  EXPECT_EQ(text.substr(0, 500), std::string(500, 'h'));
  EXPECT_EQ(text.substr(text.size() - 500), std::string(500, 't'));
  EXPECT_NE(text.find("[... 5000 bytes cut to fit the context ...]"), std::string::npos) << text;
  EXPECT_EQ(cut.back().tool_call_id, before.back().tool_call_id);
  // With turns kept whole, arguments and the unread results are untouched.
  auto two = compact_conversation(before, 2);
  EXPECT_EQ(two.back(), before.back());
  EXPECT_EQ(two[2].tool_calls, before[2].tool_calls);
}

TEST(Compaction, short_outputs_stay_as_they_are) {
  auto before = conversation(3);
  before[3].content = "ok";
  auto after = compact_conversation(before, 1);
  EXPECT_EQ(after[3].content, "ok");
}

}  // namespace
}  // namespace kiln::agent
