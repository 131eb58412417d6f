// ToolRegistry: the prompt listing, dispatch, and argument errors that name the field.
#include <gtest/gtest.h>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::ToolFixture;

TEST(Registry, ListsEveryToolWithSchemaForThePrompt) {
  ToolRegistry r = default_registry();
  nlohmann::json listing = r.prompt_schemas();
  std::vector<std::string> names;
  for (const auto& t : listing) {
    names.push_back(t["function"]["name"]);
    EXPECT_EQ(t["function"]["parameters"]["type"], "object");
    EXPECT_FALSE(t["function"]["description"].get<std::string>().empty());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bash", "view", "create", "str_replace", "insert", "grep", "submit"}));
}

TEST(Registry, UnknownToolIsAnErrorListingTheKnownOnes) {
  ToolFixture f;
  ToolResult r = f.call("rm_rf", {{"path", "/"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("unknown tool 'rm_rf'"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("str_replace"), std::string::npos) << r.text;
}

TEST(Registry, MissingRequiredArgumentIsNamed) {
  ToolFixture f;
  ToolResult r = f.call("str_replace", {{"path", "a.txt"}, {"new_str", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("missing required argument 'old_str'"), std::string::npos) << r.text;
}

TEST(Registry, WrongTypeIsNamed) {
  ToolFixture f;
  ToolResult r = f.call("insert", {{"path", "a.txt"}, {"insert_line", "3"}, {"new_str", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("'insert_line' must be an integer, got a string"), std::string::npos) << r.text;
  r = f.call("view", {{"path", "a"}, {"view_range", {1, "x"}}});
  EXPECT_NE(r.text.find("view_range"), std::string::npos) << r.text;
}

TEST(Registry, UnknownArgumentAndNonObjectAreErrors) {
  ToolFixture f;
  EXPECT_NE(f.call("view", {{"path", "."}, {"recursive", true}}).text.find("unknown argument 'recursive'"), std::string::npos);
  EXPECT_NE(f.call("view", nlohmann::json::array()).text.find("must be a JSON object"), std::string::npos);
}

TEST(Registry, SubmitRecordsTheSummaryAndFinishes) {
  ToolFixture f;
  ToolResult r = f.call("submit", {{"summary", "fixed the bug"}});
  EXPECT_FALSE(r.is_error);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.data["summary"], "fixed the bug");
}

TEST(Registry, AThrowingToolBecomesAnErrorResult) {
  ToolFixture f;
  f.registry.add({"boom", "throws", {{"type", "object"}}, [](const nlohmann::json&, Context&) -> ToolResult {
                    throw std::runtime_error("kaboom");
                  }});
  ToolResult r = f.call("boom", nlohmann::json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("kaboom"), std::string::npos);
}

}  // namespace
}  // namespace kiln::tools
