// view (files, ranges, caps, directories) and grep (regex, glob, caps).
#include <gtest/gtest.h>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::ToolFixture;

TEST(View, NumbersLinesAndHonoursRange) {
  ToolFixture f;
  f.ws.write("f.txt", "alpha\r\nbeta\r\ngamma\r\n");
  ToolResult all = f.call("view", {{"path", "f.txt"}});
  ASSERT_FALSE(all.is_error) << all.text;
  EXPECT_EQ(all.text, "     1\talpha\n     2\tbeta\n     3\tgamma\n");
  ToolResult part = f.call("view", {{"path", "f.txt"}, {"view_range", {2, -1}}});
  EXPECT_EQ(part.text, "     2\tbeta\n     3\tgamma\n");
  EXPECT_TRUE(f.call("view", {{"path", "f.txt"}, {"view_range", {9, 10}}}).is_error);
}

TEST(View, LongFilesAreCappedWithAHowToSeeMoreNote) {
  ToolFixture f;
  std::string text;
  for (int i = 1; i <= 1000; ++i) text += "line " + std::to_string(i) + "\n";
  f.ws.write("long.txt", text);
  ToolResult r = f.call("view", {{"path", "long.txt"}});
  EXPECT_NE(r.text.find("   400\tline 400\n"), std::string::npos);
  EXPECT_EQ(r.text.find("line 401\n"), std::string::npos);
  EXPECT_NE(r.text.find("view_range [401, 800]"), std::string::npos) << r.text.substr(r.text.size() - 200);
}

TEST(View, DirectoryListsTwoLevelsSkippingHidden) {
  ToolFixture f;
  f.ws.write("src/main.c", "");
  f.ws.write("src/lib/util.c", "");
  f.ws.write("src/lib/deep/x.c", "");
  f.ws.write(".hidden/secret", "");
  f.ws.write("README", "");
  ToolResult r = f.call("view", {{"path", "."}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_NE(r.text.find("README\n"), std::string::npos);
  EXPECT_NE(r.text.find("src/main.c\n"), std::string::npos);
  EXPECT_NE(r.text.find("src/lib/\n"), std::string::npos);
  EXPECT_EQ(r.text.find("util.c"), std::string::npos);  // third level
  EXPECT_EQ(r.text.find(".hidden"), std::string::npos);
  EXPECT_EQ(r.text.find(".kiln"), std::string::npos);
}

TEST(View, BinaryFilesAreNotDumped) {
  ToolFixture f;
  f.ws.write("blob.bin", std::string("\x7f" "ELF\0\0\0", 7));
  ToolResult r = f.call("view", {{"path", "blob.bin"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("binary"), std::string::npos);
}

TEST(Grep, FindsMatchesWithFileAndLineAndFiltersByGlob) {
  ToolFixture f;
  f.ws.write("a.py", "def foo():\n    return 1\n");
  f.ws.write("pkg/b.py", "x = foo()\n");
  f.ws.write("c.txt", "foo in text\n");
  f.ws.write(".git/objects/zz", "foo in git\n");
  ToolResult r = f.call("grep", {{"pattern", "fo+\\("}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(r.text, "a.py:1: def foo():\npkg/b.py:1: x = foo()\n");
  ToolResult g = f.call("grep", {{"pattern", "foo"}, {"glob", "*.txt"}});
  EXPECT_EQ(g.text, "c.txt:1: foo in text\n");
  ToolResult ci = f.call("grep", {{"pattern", "DEF"}, {"ignore_case", true}});
  EXPECT_EQ(ci.text, "a.py:1: def foo():\n");
}

TEST(Grep, BadRegexAndNoMatchesAreReported) {
  ToolFixture f;
  f.ws.write("a.txt", "abc\n");
  ToolResult bad = f.call("grep", {{"pattern", "(unclosed"}});
  EXPECT_TRUE(bad.is_error);
  EXPECT_NE(bad.text.find("not a valid regex"), std::string::npos);
  ToolResult none = f.call("grep", {{"pattern", "zzz"}});
  EXPECT_FALSE(none.is_error);
  EXPECT_NE(none.text.find("No matches"), std::string::npos);
}

TEST(Grep, ResultsAreCapped) {
  ToolFixture f;
  std::string text;
  for (int i = 0; i < 500; ++i) text += "match\n";
  f.ws.write("many.txt", text);
  ToolResult r = f.call("grep", {{"pattern", "match"}});
  EXPECT_EQ(r.data["matches"], 200);
  EXPECT_NE(r.text.find("stopped at 200 matches"), std::string::npos);
}

}  // namespace
}  // namespace kiln::tools
