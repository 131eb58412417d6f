// The edit tools change only the edited span: CRLF, tabs, BOM and a missing final newline survive.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::ToolFixture;

const std::string kBom = "\xEF\xBB\xBF";

TEST(EditFidelity, StrReplaceKeepsEveryOtherByte) {
  ToolFixture f;
  std::string before = kBom + "first\r\n\tsecond\tline\r\n  third \r\nlast no newline";
  f.ws.write("f.txt", before);
  ToolResult r = f.call("str_replace", {{"path", "f.txt"}, {"old_str", "second"}, {"new_str", "2nd"}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(f.ws.read("f.txt"), kBom + "first\r\n\t2nd\tline\r\n  third \r\nlast no newline");
}

TEST(EditFidelity, StrReplaceAcrossLinesAdaptsToCrlf) {
  ToolFixture f;
  f.ws.write("w.bat", "@echo off\r\nset A=1\r\nset B=2\r\necho done\r\n");
  // The model saw the file through `view`, which shows no '\r'.
  ToolResult r = f.call("str_replace", {{"path", "w.bat"}, {"old_str", "set A=1\nset B=2"}, {"new_str", "set A=10\nset B=20\nset C=30"}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(f.ws.read("w.bat"), "@echo off\r\nset A=10\r\nset B=20\r\nset C=30\r\necho done\r\n");
  EXPECT_EQ(r.data["crlf_adapted"], true);
}

TEST(EditFidelity, StrReplaceKeepsModeAndDeletesWithEmptyNewStr) {
  ToolFixture f;
  f.ws.write("run.sh", "#!/bin/sh\necho a\necho b\n");
  chmod((f.ws.path() / "run.sh").c_str(), 0755);
  ToolResult r = f.call("str_replace", {{"path", "run.sh"}, {"old_str", "echo a\n"}, {"new_str", ""}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(f.ws.read("run.sh"), "#!/bin/sh\necho b\n");
  struct stat st {};
  stat((f.ws.path() / "run.sh").c_str(), &st);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
}

TEST(EditFidelity, StrReplaceZeroOrManyMatchesOrEmptyIsAnErrorAndLeavesTheFile) {
  ToolFixture f;
  std::string before = "x = 1\ny = 2\nx = 1\n";
  f.ws.write("a.py", before);
  ToolResult none = f.call("str_replace", {{"path", "a.py"}, {"old_str", "z = 3"}, {"new_str", "q"}});
  EXPECT_TRUE(none.is_error);
  EXPECT_NE(none.text.find("0 matches"), std::string::npos) << none.text;
  ToolResult many = f.call("str_replace", {{"path", "a.py"}, {"old_str", "x = 1"}, {"new_str", "q"}});
  EXPECT_TRUE(many.is_error);
  EXPECT_NE(many.text.find("occurs 2 times"), std::string::npos) << many.text;
  EXPECT_NE(many.text.find("lines 1, 3"), std::string::npos) << many.text;
  ToolResult empty = f.call("str_replace", {{"path", "a.py"}, {"old_str", ""}, {"new_str", "q"}});
  EXPECT_TRUE(empty.is_error);
  EXPECT_NE(empty.text.find("old_str is empty"), std::string::npos);
  EXPECT_EQ(f.ws.read("a.py"), before);
}

TEST(EditFidelity, StrReplaceReturnsANumberedSnippet) {
  ToolFixture f;
  f.ws.write("s.txt", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n");
  ToolResult r = f.call("str_replace", {{"path", "s.txt"}, {"old_str", "f\n"}, {"new_str", "F\n"}});
  ASSERT_FALSE(r.is_error);
  EXPECT_NE(r.text.find("     6\tF\n"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("     2\tb\n"), std::string::npos) << r.text;
}

// A long edit is not echoed whole: its first and last lines, with the count left out between.
TEST(EditFidelity, LongEditsShowTheirEdgesNotTheWholeText) {
  ToolFixture f;
  f.ws.write("big.txt", "top\nbottom\n");
  std::string lines;
  for (int i = 1; i <= 3000; ++i) lines += "line " + std::to_string(i) + "\n";
  ToolResult ins = f.call("insert", {{"path", "big.txt"}, {"insert_line", 1}, {"new_str", lines}});
  ASSERT_FALSE(ins.is_error) << ins.text.substr(0, 300);
  EXPECT_LT(ins.text.size(), 2000u);
  EXPECT_NE(ins.text.find("     1\ttop\n     2\tline 1\n"), std::string::npos) << ins.text;
  EXPECT_NE(ins.text.find("[... 2978 lines not shown ...]\n"), std::string::npos) << ins.text;
  EXPECT_NE(ins.text.find("  3001\tline 3000\n  3002\tbottom\n"), std::string::npos) << ins.text;
  ToolResult rep = f.call("str_replace", {{"path", "big.txt"}, {"old_str", "bottom\n"}, {"new_str", lines}});
  ASSERT_FALSE(rep.is_error) << rep.text.substr(0, 300);
  EXPECT_LT(rep.text.size(), 2000u);
  EXPECT_NE(rep.text.find("lines not shown"), std::string::npos) << rep.text;
}

TEST(EditFidelity, InsertKeepsCrlfBomAndMissingFinalNewline) {
  ToolFixture f;
  f.ws.write("c.txt", kBom + "one\r\ntwo\r\nthree");
  ToolResult mid = f.call("insert", {{"path", "c.txt"}, {"insert_line", 1}, {"new_str", "one-and-a-half\n"}});
  ASSERT_FALSE(mid.is_error) << mid.text;
  EXPECT_EQ(f.ws.read("c.txt"), kBom + "one\r\none-and-a-half\r\ntwo\r\nthree");
  ToolResult end = f.call("insert", {{"path", "c.txt"}, {"insert_line", 4}, {"new_str", "four"}});
  ASSERT_FALSE(end.is_error) << end.text;
  EXPECT_EQ(f.ws.read("c.txt"), kBom + "one\r\none-and-a-half\r\ntwo\r\nthree\r\nfour");
  ToolResult top = f.call("insert", {{"path", "c.txt"}, {"insert_line", 0}, {"new_str", "zero"}});
  ASSERT_FALSE(top.is_error) << top.text;
  // Inserting at the top puts the text before the BOM's line: the BOM stays the file's first bytes
  // only if the model keeps it; kiln inserts exactly where asked.
  EXPECT_EQ(f.ws.read("c.txt"), "zero\r\n" + kBom + "one\r\none-and-a-half\r\ntwo\r\nthree\r\nfour");
}

TEST(EditFidelity, InsertOutOfRangeIsAnError) {
  ToolFixture f;
  f.ws.write("t.txt", "a\nb\n");
  ToolResult r = f.call("insert", {{"path", "t.txt"}, {"insert_line", 5}, {"new_str", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("has 2 lines"), std::string::npos) << r.text;
  EXPECT_EQ(f.ws.read("t.txt"), "a\nb\n");
}

TEST(EditFidelity, CreateMakesParentsAndRefusesToOverwrite) {
  ToolFixture f;
  ToolResult r = f.call("create", {{"path", "src/deep/new.c"}, {"file_text", "int main(void){}\r\n"}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(f.ws.read("src/deep/new.c"), "int main(void){}\r\n");
  ToolResult again = f.call("create", {{"path", "src/deep/new.c"}, {"file_text", "x"}});
  EXPECT_TRUE(again.is_error);
  EXPECT_NE(again.text.find("already exists"), std::string::npos);
  EXPECT_EQ(f.ws.read("src/deep/new.c"), "int main(void){}\r\n");
}

TEST(EditFidelity, FilesMadeByToolsStayWritableByTheSandbox) {
  ToolFixture f;
  ASSERT_FALSE(f.call("create", {{"path", "made/by/tool.txt"}, {"file_text", "v1\n"}}).is_error);
  ToolResult r = f.call("bash", {{"command", "echo v2 >> made/by/tool.txt && touch made/by/sibling"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(f.ws.read("made/by/tool.txt"), "v1\nv2\n");
}

}  // namespace
}  // namespace kiln::tools
