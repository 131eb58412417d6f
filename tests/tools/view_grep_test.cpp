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

// A line longer than the whole view (minified code): its start is shown with how much is left,
// and following the notes walks forward through the file instead of repeating the same range.
TEST(View, OverlongLineIsCutInsideWithANoteAndTheNextRangeMovesOn) {
  ToolFixture f;
  f.ws.write("min.js", "first\n" + std::string(50'000, 'x') + "\nlast\n");
  ToolResult r1 = f.call("view", {{"path", "min.js"}});
  EXPECT_EQ(r1.text.rfind("     1\tfirst\n[shown lines 1-1 of 3; use view_range [2, 3] to see more]\n", 0), 0u) << r1.text.substr(0, 200);
  ToolResult r2 = f.call("view", {{"path", "min.js"}, {"view_range", {2, 3}}});
  ASSERT_FALSE(r2.is_error) << r2.text.substr(0, 200);
  EXPECT_LT(r2.text.size(), 21'000u);
  EXPECT_NE(r2.text.find("\n[... line 2 goes on for "), std::string::npos);
  EXPECT_NE(r2.text.find("use view_range [3, 3]"), std::string::npos) << r2.text.substr(r2.text.size() - 300);
  EXPECT_EQ(r2.data["last"], 2);
  ToolResult r3 = f.call("view", {{"path", "min.js"}, {"view_range", {3, 3}}});
  EXPECT_EQ(r3.text, "     3\tlast\n");
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

// Files too big to search are named, not skipped in silence ("No matches" would read as "this is
// not in the code").
TEST(Grep, FilesTooBigToSearchAreNamed) {
  ToolFixture f;
  f.ws.write("big/amalgamation.c", std::string(5u << 20, 'a') + "\nneedle\n");
  f.ws.write("small.c", "no\n");
  ToolResult r = f.call("grep", {{"pattern", "needle"}});
  EXPECT_NE(r.text.find("No matches"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("[not searched: 1 file(s) over 4 MiB: big/amalgamation.c;"), std::string::npos) << r.text;
  EXPECT_EQ(r.data["not_searched"], nlohmann::json::array({"big/amalgamation.c"}));
  ToolResult one = f.call("grep", {{"pattern", "needle"}, {"path", "big/amalgamation.c"}});
  EXPECT_NE(one.text.find("not searched"), std::string::npos) << one.text;
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
