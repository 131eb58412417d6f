// kiln's own git operations on a build's workspace, through libgit2 (never the git CLI).
// The agent's `bash` may run read-only git commands in the sandbox; writes to the repository
// (branch, commit) happen only here. libgit2 headers stay inside tools/git.cpp.
//
// Every function returns a GitOutcome: ok() or an error message naming the repository, ref or
// path at fault (libgit2's own message appended). Thread-safety: functions on different
// workspaces may run concurrently; one workspace is used by one thread at a time.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::tools {

template <class T>
struct GitOutcome {
  T value{};
  std::string error;  // empty on success
  bool ok() const { return error.empty(); }
};

struct CloneInfo {
  std::string base_commit;  // full hex id of the commit the build starts from
  std::string branch;       // "kiln/<build-id>", checked out
};

// Clones `source` (URL or local path) into `dest` (must not exist or be empty), resolves `ref`
// (branch, tag, or commit; empty = the remote's HEAD), creates and checks out branch
// kiln/<build_id> at it (the only local branch: the source's default branch gets none, so a
// source branch named `kiln` cannot collide), records the base commit in the repository config (kiln.base), and writes
// `.kiln/` into .git/info/exclude so kiln's own files (saved outputs, $HOME) stay out of diffs and
// commits. The clone is self-contained (objects fetched, never an alternates link to the
// source); a shallow local source is refused, an empty one is named as such, and so is a commit
// that tracks `.kiln` at its root (kiln's own directory: it would be deleted or overwritten, and
// the build's commit would carry that), before anything is checked out. Submodules are
// checked out at their recorded commits (relative URLs against the source), or the clone fails.
GitOutcome<CloneInfo> git_clone_workspace(const std::string& source, const std::string& ref,
                                          const std::filesystem::path& dest, const std::string& build_id);

// A build's source checked before it is queued, where that costs nothing: a local source (an
// absolute path, or a plain file:/// URL) must be a git repository with commits, not shallow, in
// which a plain-name `ref` names a branch, tag or commit, also as the clone spells them
// (origin/<branch>, origin/HEAD; empty: its HEAD), that does not track `.kiln` at its root. Other sources, and refs with revision syntax
// (~, ^, @{…}, :/…), are left to the clone. On failure `field` names the input at fault: "repo"
// or "ref". Never stricter than git_clone_workspace: what it refuses, a clone would fail on.
struct SourceCheck {
  std::string error;  // empty when fine (or not checked)
  std::string field;
  bool ok() const { return error.empty(); }
};
SourceCheck check_local_source(const std::string& source, const std::string& ref);

struct StatusEntry {
  std::string path;
  std::string status;  // "new", "modified", "deleted", "renamed", "typechange"
};
// Working tree + index against HEAD, untracked files included, ignored files excluded.
GitOutcome<std::vector<StatusEntry>> git_status(const std::filesystem::path& workspace);

// Unified patch of the working tree (untracked files included) against `base_commit`;
// empty base_commit = the kiln.base recorded at clone time.
GitOutcome<std::string> git_diff(const std::filesystem::path& workspace, const std::string& base_commit = "");

// Stages every change (additions, modifications, deletions; ignored files excluded) and commits
// it on HEAD's branch with author and committer `kiln <kiln@localhost>`. Returns the new commit id.
// With nothing to commit, returns an error saying so. Untracked directories that hold their own
// repository (a `git init` inside the tree, a fixture repo) cannot be staged: they are skipped
// and named in *nested_repos ("dir/"), the rest is committed.
GitOutcome<std::string> git_commit_all(const std::filesystem::path& workspace, const std::string& message,
                                       std::vector<std::string>* nested_repos = nullptr);

// Pushes refs/heads/<branch> of the workspace (forced) into the bare repository `bare_repo`,
// created on first use. Returns the pushed commit id.
GitOutcome<std::string> git_push_branch(const std::filesystem::path& workspace, const std::string& branch,
                                        const std::filesystem::path& bare_repo);

// Resets index and working tree to HEAD and removes untracked files and directories (ignored
// ones stay, as `git clean -fd` would). Returns the removed paths.
GitOutcome<std::vector<std::string>> git_reset_clean(const std::filesystem::path& workspace);

// remove_all that first gives the owner rwx on every directory under `path`, so what a command
// left read-only does not keep it. True when `path` is gone (or never was); else *error says why.
bool remove_tree(const std::filesystem::path& path, std::string* error = nullptr);

// The commit HEAD points at, and the current branch's short name.
GitOutcome<std::string> git_head_commit(const std::filesystem::path& workspace);
GitOutcome<std::string> git_current_branch(const std::filesystem::path& workspace);

}  // namespace kiln::tools
