// The policy → bwrap argument vector, read without running anything.
#include <gtest/gtest.h>

#include <algorithm>

#include "sandbox/sandbox.h"

namespace kiln::sandbox {
namespace {

bool has_sequence(const std::vector<std::string>& args, const std::vector<std::string>& seq) {
  return std::search(args.begin(), args.end(), seq.begin(), seq.end()) != args.end();
}

std::size_t index_of(const std::vector<std::string>& args, const std::vector<std::string>& seq) {
  return static_cast<std::size_t>(std::search(args.begin(), args.end(), seq.begin(), seq.end()) - args.begin());
}

HostLayout merged_usr_layout() {
  HostLayout l;
  l.symlinks = {{"/bin", "usr/bin"}, {"/lib", "usr/lib"}};
  l.directories = {"/usr", "/etc"};
  l.has_git_dir = true;
  l.run_uid = 65534;
  l.run_gid = 65534;
  return l;
}

TEST(BwrapArgs, IsolatesEverythingAndBindsOnlyTheWorkspaceWritable) {
  Policy p;
  p.workspace = "/srv/ws/b1";
  p.limits.tmp_bytes = 1 << 20;
  auto a = bwrap_args(p, merged_usr_layout(), {"make", "test"});
  EXPECT_TRUE(has_sequence(a, {"--unshare-all"}));
  EXPECT_TRUE(has_sequence(a, {"--die-with-parent"}));
  EXPECT_TRUE(has_sequence(a, {"--new-session"}));
  EXPECT_TRUE(has_sequence(a, {"--cap-drop", "ALL"}));
  EXPECT_FALSE(has_sequence(a, {"--share-net"}));
  EXPECT_TRUE(has_sequence(a, {"--uid", "65534", "--gid", "65534"}));
  EXPECT_TRUE(has_sequence(a, {"--ro-bind", "/usr", "/usr"}));
  EXPECT_TRUE(has_sequence(a, {"--ro-bind", "/etc", "/etc"}));
  EXPECT_TRUE(has_sequence(a, {"--symlink", "usr/bin", "/bin"}));
  EXPECT_TRUE(has_sequence(a, {"--size", "1048576", "--tmpfs", "/tmp"}));
  EXPECT_TRUE(has_sequence(a, {"--bind", "/srv/ws/b1", "/workspace"}));
  // .git read-only, mounted after (so over) the writable workspace.
  EXPECT_LT(index_of(a, {"--bind", "/srv/ws/b1", "/workspace"}), index_of(a, {"--ro-bind", "/srv/ws/b1/.git", "/workspace/.git"}));
  EXPECT_LT(index_of(a, {"--ro-bind", "/srv/ws/b1/.git", "/workspace/.git"}), a.size());
  EXPECT_TRUE(has_sequence(a, {"--chdir", "/workspace", "--clearenv"}));
  // No writable bind other than the workspace.
  EXPECT_EQ(std::count(a.begin(), a.end(), "--bind"), 1);
  EXPECT_EQ(std::count(a.begin(), a.end(), "--dev-bind"), 0);
  // The command comes last, after "--", unchanged.
  ASSERT_GE(a.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(a.end() - 3, a.end()), (std::vector<std::string>{"--", "make", "test"}));
}

TEST(BwrapArgs, EnvironmentIsCleanAndNonInteractive) {
  Policy p;
  p.workspace = "/w";
  p.extra_env = {{"GOFLAGS", "-mod=vendor"}};
  auto env = sandbox_env(p);
  auto value = [&](const std::string& name) {
    for (auto& [k, v] : env) if (k == name) return v;
    return std::string("<unset>");
  };
  EXPECT_EQ(value("HOME"), "/workspace/.kiln/home");
  EXPECT_EQ(value("PAGER"), "cat");
  EXPECT_EQ(value("GIT_PAGER"), "cat");
  EXPECT_EQ(value("CI"), "1");
  EXPECT_EQ(value("TERM"), "dumb");
  EXPECT_EQ(value("GOFLAGS"), "-mod=vendor");
  EXPECT_NE(value("PATH").find("/usr/bin"), std::string::npos);
  auto a = bwrap_args(p, merged_usr_layout(), {"true"});
  EXPECT_TRUE(has_sequence(a, {"--setenv", "CI", "1"}));
}

TEST(BwrapArgs, WithoutGitDirNoGitMount) {
  Policy p;
  p.workspace = "/w";
  HostLayout l = merged_usr_layout();
  l.has_git_dir = false;
  auto a = bwrap_args(p, l, {"true"});
  EXPECT_FALSE(has_sequence(a, {"--ro-bind", "/w/.git", "/workspace/.git"}));
}

}  // namespace
}  // namespace kiln::sandbox
