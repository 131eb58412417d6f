// kiln's git operations on real repositories made in temp dirs: clone at a ref, branch, edit,
// diff shows exactly the edit, commit lands on the branch with kiln as author.
#include <gtest/gtest.h>

#include <cstdio>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::TempWorkspace;

// Runs a shell command (fixture setup and independent checks with the git CLI); returns stdout.
std::string shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  pclose(pipe);
  return out;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

struct SourceRepo {
  TempWorkspace dir;
  std::string first, second;
  SourceRepo() {
    std::string git = "git -C " + dir.path().string() + " -c user.name=t -c user.email=t@t -c init.defaultBranch=main ";
    shell(git + "init -q");
    dir.write("a.txt", "one\n");
    shell(git + "add -A && " + git + "commit -qm first && " + git + "tag v1");
    first = trimmed(shell(git + "rev-parse HEAD"));
    dir.write("a.txt", "one\ntwo\n");
    dir.write("b.txt", "bee\n");
    shell(git + "add -A && " + git + "commit -qm second");
    second = trimmed(shell(git + "rev-parse HEAD"));
  }
};

std::string git_cli(const std::filesystem::path& repo, const std::string& args) {
  return trimmed(shell("git -c safe.directory='*' -C " + repo.string() + " " + args));
}

TEST(Git, CloneEditDiffCommitOnTheBuildBranch) {
  SourceRepo src;
  ASSERT_EQ(src.first.size(), 40u);
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "build-42";
  auto cloned = git_clone_workspace(src.dir.path().string(), "main", dest, "42");
  ASSERT_TRUE(cloned.ok()) << cloned.error;
  EXPECT_EQ(cloned.value.base_commit, src.second);
  EXPECT_EQ(cloned.value.branch, "kiln/42");
  EXPECT_EQ(git_current_branch(dest).value, "kiln/42");

  kiln::testing::ToolFixture f;  // tools run against the clone, prepared like a build's
  f.ctx.workspace = dest;
  f.ctx.policy.workspace = dest;
  ASSERT_EQ(sandbox::prepare_workspace(f.ctx.policy), "");
  ASSERT_FALSE(f.call("str_replace", {{"path", "a.txt"}, {"old_str", "two"}, {"new_str", "TWO"}}).is_error);
  // kiln's own files must stay out of the diff and the commit.
  ASSERT_FALSE(f.call("bash", {{"command", "mkdir -p .kiln/outputs && echo log > .kiln/outputs/1.log && echo h > $HOME/x"}}).is_error);

  auto status = git_status(dest);
  ASSERT_TRUE(status.ok()) << status.error;
  ASSERT_EQ(status.value.size(), 1u);
  EXPECT_EQ(status.value[0].path, "a.txt");
  EXPECT_EQ(status.value[0].status, "modified");

  auto diff = git_diff(dest);
  ASSERT_TRUE(diff.ok()) << diff.error;
  EXPECT_EQ(diff.value,
            "diff --git a/a.txt b/a.txt\n"
            "index 814f4a4..879de50 100644\n"
            "--- a/a.txt\n"
            "+++ b/a.txt\n"
            "@@ -1,2 +1,2 @@\n"
            " one\n"
            "-two\n"
            "+TWO\n");

  auto commit = git_commit_all(dest, "Uppercase two");
  ASSERT_TRUE(commit.ok()) << commit.error;
  EXPECT_EQ(git_head_commit(dest).value, commit.value);
  EXPECT_EQ(git_cli(dest, "log -1 --format='%an <%ae>|%cn|%s|%P' kiln/42"), "kiln <kiln@localhost>|kiln|Uppercase two|" + src.second);
  EXPECT_EQ(git_cli(dest, "show --name-only --format= HEAD"), "a.txt");
  EXPECT_EQ(git_cli(dest, "show HEAD:a.txt"), "one\nTWO");
  EXPECT_TRUE(git_status(dest).value.empty());
  auto again = git_commit_all(dest, "nothing");
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.error.find("nothing to commit"), std::string::npos);
  // The diff is against the starting commit, so it still shows the build's whole change.
  EXPECT_NE(git_diff(dest).value.find("+TWO\n"), std::string::npos);
}

TEST(Git, NewAndDeletedFilesAppearInDiffAndCommit) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "7").ok());
  std::filesystem::remove(dest / "b.txt");
  std::filesystem::create_directories(dest / "new/dir");
  { std::ofstream(dest / "new/dir/c.txt") << "sea\n"; }
  auto diff = git_diff(dest);
  ASSERT_TRUE(diff.ok()) << diff.error;
  EXPECT_NE(diff.value.find("deleted file mode"), std::string::npos) << diff.value;
  EXPECT_NE(diff.value.find("+++ b/new/dir/c.txt\n@@ -0,0 +1 @@\n+sea\n"), std::string::npos) << diff.value;
  auto commit = git_commit_all(dest, "add c, drop b");
  ASSERT_TRUE(commit.ok()) << commit.error;
  EXPECT_EQ(git_cli(dest, "show --name-status --format= HEAD"), "D\tb.txt\nA\tnew/dir/c.txt");
}

// Caches a test run leaves behind in a repository without a .gitignore stay out of the change.
TEST(Git, CachesLeftByTestRunsAreNotPartOfTheChange) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "8").ok());
  for (const char* dir : {"__pycache__", "pkg/__pycache__", ".pytest_cache/v", "node_modules/left-pad", ".venv/bin"})
    std::filesystem::create_directories(dest / dir);
  { std::ofstream(dest / "__pycache__/stats.cpython-311.pyc") << "bytecode"; }
  { std::ofstream(dest / "pkg/__pycache__/m.cpython-311.pyc") << "bytecode"; }
  { std::ofstream(dest / ".pytest_cache/v/lastfailed") << "{}"; }
  { std::ofstream(dest / "node_modules/left-pad/index.js") << "x"; }
  { std::ofstream(dest / ".venv/bin/python") << "x"; }
  { std::ofstream(dest / "stray.pyc") << "x"; }
  { std::ofstream(dest / "kept.py") << "print(1)\n"; }
  auto status = git_status(dest);
  ASSERT_TRUE(status.ok()) << status.error;
  ASSERT_EQ(status.value.size(), 1u);
  EXPECT_EQ(status.value[0].path, "kept.py");
}

TEST(Git, CloneAtATagOrCommit) {
  SourceRepo src;
  TempWorkspace parent;
  auto tag = git_clone_workspace(src.dir.path().string(), "v1", parent.path() / "t", "t1");
  ASSERT_TRUE(tag.ok()) << tag.error;
  EXPECT_EQ(tag.value.base_commit, src.first);
  EXPECT_EQ(parent.read("t/a.txt"), "one\n");
  EXPECT_FALSE(std::filesystem::exists(parent.path() / "t/b.txt"));
  auto sha = git_clone_workspace(src.dir.path().string(), src.first, parent.path() / "s", "s1");
  ASSERT_TRUE(sha.ok()) << sha.error;
  EXPECT_EQ(sha.value.base_commit, src.first);
}

TEST(Git, ErrorsNameTheRefThePathAndTheSource) {
  SourceRepo src;
  TempWorkspace parent;
  auto bad_ref = git_clone_workspace(src.dir.path().string(), "no-such-branch", parent.path() / "a", "x");
  EXPECT_NE(bad_ref.error.find("no-such-branch"), std::string::npos) << bad_ref.error;
  parent.write("full/file", "x");
  auto not_empty = git_clone_workspace(src.dir.path().string(), "main", parent.path() / "full", "x");
  EXPECT_NE(not_empty.error.find("not empty"), std::string::npos) << not_empty.error;
  auto bad_source = git_clone_workspace(parent.path().string() + "/missing-repo", "main", parent.path() / "b", "x");
  EXPECT_NE(bad_source.error.find("missing-repo"), std::string::npos) << bad_source.error;
  auto bad_id = git_clone_workspace(src.dir.path().string(), "main", parent.path() / "c", "a..b");
  EXPECT_NE(bad_id.error.find("build id"), std::string::npos) << bad_id.error;
  auto not_repo = git_diff(parent.path());
  EXPECT_FALSE(not_repo.ok());
  EXPECT_NE(not_repo.error.find(parent.path().string()), std::string::npos);
}

}  // namespace
}  // namespace kiln::tools
