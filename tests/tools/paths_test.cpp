// Paths from the model: escapes by `..`, absolute paths and symlinks are refused; files outside
// the workspace stay untouched.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::ToolFixture;

std::string host_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Paths, SymlinkToEtcPasswdCannotBeViewedOrEdited) {
  ToolFixture f;
  std::string passwd = host_file("/etc/passwd");
  ASSERT_EQ(symlink("/etc/passwd", (f.ws.path() / "innocent.txt").c_str()), 0);
  ToolResult v = f.call("view", {{"path", "innocent.txt"}});
  EXPECT_TRUE(v.is_error);
  EXPECT_NE(v.text.find("outside the workspace"), std::string::npos) << v.text;
  EXPECT_EQ(v.text.find("root:"), std::string::npos);
  ToolResult e = f.call("str_replace", {{"path", "innocent.txt"}, {"old_str", "root"}, {"new_str", "toor"}});
  EXPECT_TRUE(e.is_error);
  ToolResult i = f.call("insert", {{"path", "innocent.txt"}, {"insert_line", 0}, {"new_str", "evil::0:0::/:/bin/sh\n"}});
  EXPECT_TRUE(i.is_error);
  EXPECT_EQ(host_file("/etc/passwd"), passwd);
}

TEST(Paths, SymlinkedDirectoryLeadingOutIsRefused) {
  ToolFixture f;
  ASSERT_EQ(symlink("/", (f.ws.path() / "up").c_str()), 0);
  EXPECT_TRUE(f.call("view", {{"path", "up/etc/passwd"}}).is_error);
  ToolResult c = f.call("create", {{"path", "up/tmp/kiln-escape-test"}, {"file_text", "x"}});
  EXPECT_TRUE(c.is_error);
  EXPECT_EQ(access("/tmp/kiln-escape-test", F_OK), -1);
  EXPECT_TRUE(f.call("grep", {{"pattern", "root"}, {"path", "up/etc"}}).is_error);
}

// A FIFO the model made: opening it to read would wait for a writer forever, and nothing in the
// tool path looks at cancellation. Every file tool refuses it at once.
TEST(Paths, FifoIsRefusedWithoutBlocking) {
  ToolFixture f;
  ASSERT_EQ(mkfifo((f.ws.path() / "notes.txt").c_str(), 0644), 0);
  for (const auto& [tool, args] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"view", {{"path", "notes.txt"}}},
           {"str_replace", {{"path", "notes.txt"}, {"old_str", "a"}, {"new_str", "b"}}},
           {"insert", {{"path", "notes.txt"}, {"insert_line", 0}, {"new_str", "x"}}},
           {"grep", {{"pattern", "a"}, {"path", "notes.txt"}}}}) {
    ToolResult r = f.call(tool, args);  // a hang here fails the test by the suite's timeout
    EXPECT_TRUE(r.is_error || r.text.find("No matches") != std::string::npos) << tool << ": " << r.text;
  }
}

TEST(Paths, DotDotAndAbsolutePathsOutsideAreRefused) {
  ToolFixture f;
  for (const char* path : {"../../etc/passwd", "../x", "a/../../b", "/etc/passwd", "/workspace/../etc/passwd"}) {
    ToolResult r = f.call("view", {{"path", path}});
    EXPECT_TRUE(r.is_error) << path;
    EXPECT_EQ(r.text.find("root:"), std::string::npos) << path;
  }
  ToolResult c = f.call("create", {{"path", "../../tmp/kiln-dotdot-test"}, {"file_text", "x"}});
  EXPECT_TRUE(c.is_error);
  EXPECT_NE(c.text.find("leaves the workspace"), std::string::npos) << c.text;
  EXPECT_EQ(access("/tmp/kiln-dotdot-test", F_OK), -1);
}

TEST(Paths, WorkspacePathsInAllSpellingsWork) {
  ToolFixture f;
  f.ws.write("src/a.txt", "hello\n");
  ASSERT_EQ(symlink("src/a.txt", (f.ws.path() / "link-inside").c_str()), 0);
  for (std::string path : {std::string("src/a.txt"), std::string("./src/../src/a.txt"), std::string("/workspace/src/a.txt"),
                           (f.ws.path() / "src/a.txt").string(), std::string("link-inside")}) {
    ToolResult r = f.call("view", {{"path", path}});
    EXPECT_FALSE(r.is_error) << path << ": " << r.text;
    EXPECT_NE(r.text.find("     1\thello"), std::string::npos) << path;
  }
}

TEST(Paths, ToolsNeverWriteIntoGit) {
  ToolFixture f;
  f.ws.write(".git/HEAD", "ref: refs/heads/main\n");
  ToolResult r = f.call("str_replace", {{"path", ".git/HEAD"}, {"old_str", "main"}, {"new_str", "evil"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find(".git"), std::string::npos);
  EXPECT_TRUE(f.call("create", {{"path", ".git/hooks/post-commit"}, {"file_text", "#!/bin/sh\n"}}).is_error);
  EXPECT_EQ(f.ws.read(".git/HEAD"), "ref: refs/heads/main\n");
  EXPECT_FALSE(f.call("view", {{"path", ".git/HEAD"}}).is_error);  // reading is fine
}

}  // namespace
}  // namespace kiln::tools
