// kiln's git operations on real repositories made in temp dirs: clone at a ref, branch, edit,
// diff shows exactly the edit, commit lands on the branch with kiln as author.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "tool_fixture.h"
#include "tools/regex_leak_guard.h"

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

// The agent ran `git init` in a subdirectory (or tests left a fixture repository): libgit2 cannot
// stage it ("invalid path 'tool/'"); it is skipped and named, and the rest is committed.
TEST(Git, ANestedRepositoryIsSkippedAndTheRestCommitted) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "9").ok());
  std::filesystem::create_directories(dest / "tool");
  shell("git -C " + (dest / "tool").string() + " init -q");
  ASSERT_TRUE(std::filesystem::exists(dest / "tool/.git"));
  { std::ofstream(dest / "tool/inner.txt") << "inner\n"; }
  { std::ofstream(dest / "a.txt", std::ios::app) << "three\n"; }
  std::vector<std::string> nested;
  auto commit = git_commit_all(dest, "with a nested repo", &nested);
  ASSERT_TRUE(commit.ok()) << commit.error;
  EXPECT_EQ(nested, std::vector<std::string>{"tool/"});
  EXPECT_EQ(git_cli(dest, "show --name-only --format= HEAD"), "a.txt");
}

// The stored diff carries binary changes as binary patches, not "Binary files differ".
TEST(Git, ABinaryChangeIsInTheDiffAsABinaryPatch) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "10").ok());
  { std::ofstream(dest / "bin.dat", std::ios::binary) << std::string("\x00\x01\x02\xff binary\x00", 12); }
  auto diff = git_diff(dest);
  ASSERT_TRUE(diff.ok()) << diff.error;
  EXPECT_NE(diff.value.find("GIT binary patch"), std::string::npos) << diff.value;
}

// The build branch is pushed into a bare results repository (created on first use) that a user
// can fetch from after the workspace is gone.
TEST(Git, PushBranchIntoABareResultsRepository) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "11").ok());
  { std::ofstream(dest / "c.txt") << "sea\n"; }
  auto commit = git_commit_all(dest, "add c");
  ASSERT_TRUE(commit.ok()) << commit.error;
  std::filesystem::path results = parent.path() / "var" / "results.git";
  auto pushed = git_push_branch(dest, "kiln/11", results);
  ASSERT_TRUE(pushed.ok()) << pushed.error;
  EXPECT_EQ(pushed.value, commit.value);
  EXPECT_EQ(git_cli(results, "rev-parse --is-bare-repository"), "true");
  std::filesystem::remove_all(dest);
  EXPECT_EQ(git_cli(results, "show kiln/11:c.txt"), "sea");
  // A second build's push goes into the same repository.
  std::filesystem::path dest2 = parent.path() / "ws2";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest2, "12").ok());
  ASSERT_TRUE(git_push_branch(dest2, "kiln/12", results).ok());
  EXPECT_EQ(git_cli(results, "rev-parse kiln/12"), src.second);
}

TEST(Git, ResetCleanDropsChangesAndUntrackedFilesButKeepsIgnoredOnes) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path dest = parent.path() / "ws";
  ASSERT_TRUE(git_clone_workspace(src.dir.path().string(), "", dest, "13").ok());
  { std::ofstream(dest / "a.txt") << "changed\n"; }
  std::filesystem::create_directories(dest / "out/deep");
  { std::ofstream(dest / "out/deep/report.xml") << "x"; }
  { std::ofstream(dest / "stray.txt") << "x"; }
  std::filesystem::create_directories(dest / "__pycache__");
  { std::ofstream(dest / "__pycache__/m.pyc") << "x"; }
  auto cleaned = git_reset_clean(dest);
  ASSERT_TRUE(cleaned.ok()) << cleaned.error;
  EXPECT_EQ(parent.read("ws/a.txt"), "one\ntwo\n");
  EXPECT_FALSE(std::filesystem::exists(dest / "out"));
  EXPECT_FALSE(std::filesystem::exists(dest / "stray.txt"));
  EXPECT_TRUE(std::filesystem::exists(dest / "__pycache__/m.pyc"));
  EXPECT_TRUE(git_status(dest).value.empty());
}

// A `--shared` source (objects through alternates) must not leave the workspace pointing at a
// host path the sandbox cannot see: the clone holds its own objects.
TEST(Git, CloneOfASharedSourceHoldsItsOwnObjects) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path shared = parent.path() / "shared";
  shell("git clone -q --shared " + src.dir.path().string() + " " + shared.string());
  ASSERT_TRUE(std::filesystem::exists(shared / ".git/objects/info/alternates"));
  std::filesystem::path dest = parent.path() / "ws";
  auto cloned = git_clone_workspace(shared.string(), "", dest, "14");
  ASSERT_TRUE(cloned.ok()) << cloned.error;
  EXPECT_FALSE(std::filesystem::exists(dest / ".git/objects/info/alternates"));
  std::filesystem::remove_all(src.dir.path() / ".git/objects");  // the alternates target goes away
  EXPECT_EQ(git_cli(dest, "log --format=%s"), "second\nfirst");
}

// The submit-time check of a local source accepts every ref a clone resolves (it is never
// stricter, however the ref is spelled), refuses plain names the clone cannot resolve, naming
// the input at fault; network sources are not contacted.
TEST(Git, LocalSourceCheckIsNeverStricterThanTheCloneAndNamesTheField) {
  SourceRepo src;
  TempWorkspace parent;
  const std::string path = src.dir.path().string();
  int n = 0;
  auto clone_ok = [&](const std::string& source, const std::string& ref) {
    auto cloned = git_clone_workspace(source, ref, parent.path() / ("ws" + std::to_string(n)), std::to_string(100 + n));
    ++n;
    return cloned.ok();
  };
  for (const std::string& ref :
       {std::string(), std::string("main"), std::string("v1"), src.first, src.first.substr(0, 10),
        std::string("origin/main"), std::string("remotes/origin/main"), std::string("refs/remotes/origin/main"),
        std::string("origin/HEAD"), std::string("origin"), std::string("refs/tags/v1"), std::string("main~1"),
        std::string("HEAD~1"), std::string("v1^{commit}")}) {
    const SourceCheck check = check_local_source(path, ref);
    EXPECT_TRUE(check.ok()) << "ref '" << ref << "': " << check.error;
    EXPECT_TRUE(clone_ok(path, ref)) << "ref '" << ref << "'";
  }
  for (const std::string& ref : {std::string("nope"), std::string("v2"), std::string(40, 'f'), std::string("origin/nope")}) {
    const SourceCheck check = check_local_source(path, ref);
    EXPECT_EQ(check.field, "ref") << "ref '" << ref << "': " << check.error;
    EXPECT_FALSE(clone_ok(path, ref)) << "ref '" << ref << "'";
  }
  // Spellings only the clone reads (a host, %-escapes) are left to it.
  EXPECT_TRUE(check_local_source("file://localhost" + path, "main").ok());
  EXPECT_TRUE(clone_ok("file://localhost" + path, "main"));
  EXPECT_TRUE(check_local_source("file://" + path, "main").ok());
  EXPECT_TRUE(check_local_source("https://example.invalid/repo.git", "nope").ok());  // not contacted
  EXPECT_TRUE(check_local_source("git@example.invalid:org/repo.git", "").ok());

  auto expect_repo_error = [](const std::string& source, const std::string& words) {
    const SourceCheck check = check_local_source(source, "");
    EXPECT_EQ(check.field, "repo") << source;
    EXPECT_NE(check.error.find(words), std::string::npos) << check.error;
  };
  expect_repo_error((parent.path() / "missing").string(), "does not exist");
  std::filesystem::create_directories(parent.path() / "plain");
  expect_repo_error((parent.path() / "plain").string(), "not a git repository");
  shell("git init -q " + (parent.path() / "empty").string());
  expect_repo_error((parent.path() / "empty").string(), "empty");
  shell("git clone -q --depth 1 file://" + path + " " + (parent.path() / "shallow").string());
  expect_repo_error((parent.path() / "shallow").string(), "shallow");
}

TEST(Git, AShallowSourceIsRefusedWithTheReason) {
  SourceRepo src;
  TempWorkspace parent;
  std::filesystem::path shallow = parent.path() / "shallow";
  shell("git clone -q --depth 1 file://" + src.dir.path().string() + " " + shallow.string());
  ASSERT_TRUE(std::filesystem::exists(shallow / ".git/shallow"));
  auto cloned = git_clone_workspace(shallow.string(), "", parent.path() / "ws", "15");
  EXPECT_FALSE(cloned.ok());
  EXPECT_NE(cloned.error.find("shallow"), std::string::npos) << cloned.error;
}

// kiln keeps its own files in the workspace's /.kiln/: a repository that tracks that path (a file
// or a directory) would have it deleted or overwritten, and the build's commit would carry that.
// The clone refuses the commit it would build, with the reason, and so does the submit-time check
// of a local source; a `.kiln` deeper in the tree, or a ref from before it was added, builds.
TEST(Git, ASourceThatTracksDotKilnAtItsRootIsRefusedWithTheReason) {
  TempWorkspace parent;
  int n = 0;
  auto clone = [&](const std::string& source, const std::string& ref) {
    ++n;
    return git_clone_workspace(source, ref, parent.path() / ("ws" + std::to_string(n)), std::to_string(200 + n));
  };
  for (const char* tracked : {".kiln", ".kiln/config.toml"}) {
    SourceRepo src;
    const std::string git = "git -C " + src.dir.path().string() + " -c user.name=t -c user.email=t@t ";
    src.dir.write(tracked, "the user's own\n");
    shell(git + "add -A && " + git + "commit -qm 'add " + tracked + "'");
    auto cloned = clone(src.dir.path().string(), "main");
    EXPECT_FALSE(cloned.ok()) << tracked;
    EXPECT_NE(cloned.error.find("tracks `.kiln`"), std::string::npos) << cloned.error;
    EXPECT_FALSE(std::filesystem::exists(parent.path() / ("ws" + std::to_string(n)) / tracked)) << "checked out";
    const SourceCheck check = check_local_source(src.dir.path().string(), "main");
    EXPECT_EQ(check.field, "repo") << tracked;
    EXPECT_NE(check.error.find("tracks `.kiln`"), std::string::npos) << check.error;
    // The tag from before the commit that added it builds, and passes the check.
    EXPECT_TRUE(clone(src.dir.path().string(), "v1").ok()) << tracked;
    EXPECT_TRUE(check_local_source(src.dir.path().string(), "v1").ok()) << tracked;
  }
  SourceRepo nested;
  const std::string git = "git -C " + nested.dir.path().string() + " -c user.name=t -c user.email=t@t ";
  nested.dir.write("sub/.kiln", "fine\n");
  shell(git + "add -A && " + git + "commit -qm nested");
  auto cloned = clone(nested.dir.path().string(), "main");
  EXPECT_TRUE(cloned.ok()) << cloned.error;
  EXPECT_TRUE(check_local_source(nested.dir.path().string(), "main").ok());
  EXPECT_EQ(parent.read("ws" + std::to_string(n) + "/sub/.kiln"), "fine\n");
}

// libgit2 1.5 leaks a match data (and pcre2's ~20 KB of heap frames in it) on every regular
// expression that does not match, and its config lookups by pattern run many of them
// (tools/regex_leak_guard.cpp). Every match data libgit2 creates is freed: by libgit2, or by the
// guard once libgit2 has left it behind. At most the last one, on this thread, still waits.
TEST(Git, RegexMatchDataThatLibgit2LeavesBehindIsFreed) {
  SourceRepo src;
  TempWorkspace parent;
  const RegexLeakGuardStats before = regex_leak_guard_stats();
  for (int i = 0; i < 4; ++i) {
    auto cloned = git_clone_workspace(src.dir.path().string(), "main", parent.path() / ("ws" + std::to_string(i)),
                                      std::to_string(300 + i));
    ASSERT_TRUE(cloned.ok()) << cloned.error;
    parent.write("ws" + std::to_string(i) + "/a.txt", "changed\n");
    ASSERT_TRUE(git_commit_all(parent.path() / ("ws" + std::to_string(i)), "change").ok());
  }
  const RegexLeakGuardStats after = regex_leak_guard_stats();
  // Debian's libgit2 matches with pcre2: a clone deletes a branch's config section and creates a
  // remote by pattern, so the guard saw libgit2's match data.
  EXPECT_GT(after.created - before.created, 4) << "the guard did not see libgit2's pcre2 calls";
  EXPECT_LE(after.created - after.freed, 1) << after.reclaimed - before.reclaimed << " reclaimed";
}

// A source whose default branch is `kiln` (or `kiln/<id>`): the clone's local branch for it
// would collide with refs/heads/kiln/<id>.
TEST(Git, ASourceWhoseDefaultBranchIsKilnCanBeBuilt) {
  for (std::string name : {"kiln", "kiln/16"}) {
    SourceRepo src;
    shell("git -C " + src.dir.path().string() + " branch -m main '" + name + "'");
    TempWorkspace parent;
    std::filesystem::path dest = parent.path() / "ws";
    auto cloned = git_clone_workspace(src.dir.path().string(), "", dest, "16");
    ASSERT_TRUE(cloned.ok()) << name << ": " << cloned.error;
    EXPECT_EQ(cloned.value.base_commit, src.second);
    EXPECT_EQ(git_current_branch(dest).value, "kiln/16");
    EXPECT_EQ(git_cli(dest, "branch --format='%(refname)'"), "refs/heads/kiln/16");
    auto named = git_clone_workspace(src.dir.path().string(), name, parent.path() / "ws2", "16");
    ASSERT_TRUE(named.ok()) << name << ": " << named.error;
  }
}

TEST(Git, AnEmptySourceIsNamedAsEmpty) {
  TempWorkspace src;
  shell("git -C " + src.path().string() + " init -q");
  TempWorkspace parent;
  auto cloned = git_clone_workspace(src.path().string(), "", parent.path() / "ws", "17");
  EXPECT_FALSE(cloned.ok());
  EXPECT_NE(cloned.error.find("is empty"), std::string::npos) << cloned.error;
}

// Submodules are checked out (a relative URL resolves against the source); one that cannot be
// fails the clone naming it.
TEST(Git, SubmodulesAreCheckedOutFromTheSource) {
  TempWorkspace repos;
  std::string git = "git -c user.name=t -c user.email=t@t -c init.defaultBranch=main -c protocol.file.allow=always ";
  std::string sub = (repos.path() / "sub").string(), super = (repos.path() / "super").string();
  shell(git + "init -q " + sub + " && echo s > " + sub + "/s.txt && " + git + "-C " + sub + " add -A && " + git + "-C " +
        sub + " commit -qm s");
  shell(git + "init -q " + super + " && echo t > " + super + "/top.txt && " + git + "-C " + super +
        " submodule add -q ../sub libs/sub && " + git + "-C " + super + " add -A && " + git + "-C " + super + " commit -qm t");
  ASSERT_TRUE(std::filesystem::exists(repos.path() / "super/.gitmodules"));
  TempWorkspace parent;
  auto cloned = git_clone_workspace(super, "", parent.path() / "ws", "18");
  ASSERT_TRUE(cloned.ok()) << cloned.error;
  EXPECT_EQ(parent.read("ws/libs/sub/s.txt"), "s\n");
  EXPECT_TRUE(git_status(parent.path() / "ws").value.empty());
  // Build output inside a submodule does not stop a commit; an edit of its files does (it could
  // not be kept), naming the submodule.
  { std::ofstream(parent.path() / "ws/libs/sub/build.o") << "o"; }
  { std::ofstream(parent.path() / "ws/top.txt") << "t2\n"; }
  EXPECT_TRUE(git_commit_all(parent.path() / "ws", "top only").ok());
  { std::ofstream(parent.path() / "ws/libs/sub/s.txt") << "edited\n"; }
  auto refused = git_commit_all(parent.path() / "ws", "edit inside the submodule");
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("libs/sub"), std::string::npos) << refused.error;
  std::filesystem::remove_all(repos.path() / "sub");
  auto broken = git_clone_workspace(super, "", parent.path() / "ws2", "19");
  EXPECT_FALSE(broken.ok());
  EXPECT_NE(broken.error.find("submodule libs/sub"), std::string::npos) << broken.error;
}

// kiln running as non-root must still remove what a command left read-only.
TEST(Git, RemoveTreeRemovesReadOnlyDirectoriesAsNonRoot) {
  TempWorkspace parent;
  std::filesystem::path tree = parent.path() / "var/build-1";
  std::filesystem::create_directories(tree / "ro/sub");
  { std::ofstream(tree / "ro/sub/f") << "x"; }
  { std::ofstream(tree / "ro/g") << "x"; }
  ASSERT_EQ(shell("chown -R 65534:65534 " + (parent.path() / "var").string() + " && chmod 0500 " + (tree / "ro/sub").string() + " " +
                  (tree / "ro").string() + " && echo ok"), "ok\n");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
    _exit(remove_tree(tree) ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(std::filesystem::exists(tree));
}

}  // namespace
}  // namespace kiln::tools
