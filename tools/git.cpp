// kiln's git operations through libgit2. Every libgit2 object is held by a unique_ptr with its
// free function; every failure returns a message naming what was being done and libgit2's reason.
#include "tools/git.h"
#include "tools/regex_leak_guard.h"

#include <git2.h>

#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <mutex>

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

template <class T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
template <class T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, Deleter<T, Free>>;
using Repo = Owned<git_repository, git_repository_free>;
using Object = Owned<git_object, git_object_free>;
using Reference = Owned<git_reference, git_reference_free>;
using Commit = Owned<git_commit, git_commit_free>;
using Tree = Owned<git_tree, git_tree_free>;
using Index = Owned<git_index, git_index_free>;
using Diff = Owned<::git_diff, git_diff_free>;
using Config = Owned<git_config, git_config_free>;
using StatusList = Owned<git_status_list, git_status_list_free>;
using Signature = Owned<git_signature, git_signature_free>;
using Remote = Owned<git_remote, git_remote_free>;
using BranchIterator = Owned<git_branch_iterator, git_branch_iterator_free>;

void init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    install_regex_leak_guard();  // before libgit2's first regular expression
    git_libgit2_init();
    // Workspaces belong to the sandbox uid (so commands can write them) while kiln runs as root;
    // libgit2's "owned by current user" check would refuse them. kiln creates every workspace
    // itself, so the check protects nothing here.
    git_libgit2_opts(GIT_OPT_SET_OWNER_VALIDATION, 0);
  });
}

std::string why(const std::string& what) {
  const git_error* e = git_error_last();
  return what + ": " + (e != nullptr && e->message != nullptr ? e->message : "unknown libgit2 error");
}

template <class T>
GitOutcome<T> failure(const std::string& what) {
  GitOutcome<T> out;
  out.error = why(what);
  return out;
}

Repo open_repo(const fs::path& workspace, std::string& error) {
  init_once();
  git_repository* raw = nullptr;
  if (git_repository_open_ext(&raw, workspace.c_str(), GIT_REPOSITORY_OPEN_NO_SEARCH, nullptr) != 0) {
    error = why("cannot open repository " + workspace.string());
  }
  return Repo(raw);
}

std::string hex(const git_oid* oid) {
  char buf[GIT_OID_HEXSZ + 1];
  git_oid_tostr(buf, sizeof buf, oid);
  return buf;
}

// The commit of the first revision spec that names one (nullptr when none does).
Commit first_commit(git_repository* repo, const std::vector<std::string>& specs) {
  for (const auto& spec : specs) {
    git_object* obj = nullptr;
    if (git_revparse_single(&obj, repo, spec.c_str()) != 0) continue;
    Object owned(obj);
    git_object* peeled = nullptr;
    if (git_object_peel(&peeled, obj, GIT_OBJECT_COMMIT) != 0) continue;
    return Commit(reinterpret_cast<git_commit*>(peeled));
  }
  return nullptr;
}

// Resolves a user-supplied ref in a fresh clone: remote branch, tag, then any revision syntax.
Commit resolve_commit(git_repository* repo, const std::string& ref, std::string& error) {
  Commit commit = first_commit(repo, ref.empty() ? std::vector<std::string>{"HEAD"}
                                                 : std::vector<std::string>{"refs/remotes/origin/" + ref,
                                                                            "refs/tags/" + ref, ref});
  if (commit) return commit;
  error = "ref '" + ref + "' was not found in the cloned repository (tried a branch, a tag and a commit id)";
  return nullptr;
}

int collect_submodule(git_submodule*, const char* name, void* payload) {
  static_cast<std::vector<std::string>*>(payload)->push_back(name);
  return 0;
}

// Initialises and checks out every submodule of the checked-out tree at its recorded commit (a
// relative URL resolves against the source, origin). Without them the tree the agent and verify
// see is missing code. Returns "" or the cause.
std::string update_submodules(git_repository* repo) {
  std::vector<std::string> names;
  if (git_submodule_foreach(repo, collect_submodule, &names) != 0) return why("cannot read .gitmodules");
  for (const std::string& name : names) {
    git_submodule* raw = nullptr;
    if (git_submodule_lookup(&raw, repo, name.c_str()) != 0) return why("submodule " + name);
    Owned<git_submodule, git_submodule_free> sub(raw);
    git_submodule_update_options options = GIT_SUBMODULE_UPDATE_OPTIONS_INIT;
    options.checkout_opts.checkout_strategy = GIT_CHECKOUT_FORCE;
    if (git_submodule_update(sub.get(), /*init=*/1, &options) != 0) {
      const char* url = git_submodule_url(sub.get());
      return why("cannot check out submodule " + std::string(git_submodule_path(sub.get())) + " from " +
                 (url != nullptr ? url : "?"));
    }
  }
  return "";
}

// kiln keeps its own files in the workspace's /.kiln/ (saved command output, the sandbox $HOME):
// a repository that tracks that path would have it deleted or overwritten, and the build's commit
// would carry that as if the agent had done it. Such a commit is refused with the reason.
std::string reserved_path_error(git_commit* commit, const std::string& source) {
  git_tree* raw = nullptr;
  if (git_commit_tree(&raw, commit) != 0) return "";  // unreadable here: the checkout will say so
  Tree tree(raw);
  if (git_tree_entry_byname(tree.get(), ".kiln") == nullptr) return "";
  char id[GIT_OID_HEXSZ + 1] = {};
  git_oid_tostr(id, sizeof id, git_commit_id(commit));
  return "repo " + source + " tracks `.kiln` at its root (commit " + std::string(id, 12) +
         "); kiln reserves that path in the workspace for its own files (saved command output, the sandbox "
         "$HOME), so building it would delete or overwrite it: rename it in the repository, or build a ref "
         "without it";
}

}  // namespace

SourceCheck check_local_source(const std::string& source, const std::string& ref) {
  // Only forms read the same way here as by the clone: an absolute path, or file:/// with no
  // host and no %-escapes. Anything else (network URLs, file://host/…, escapes) waits for the clone.
  const bool file_url = source.rfind("file:///", 0) == 0 && source.find('%') == std::string::npos;
  if (!file_url && (source.empty() || source.front() != '/')) return {};
  init_once();
  const fs::path path = file_url ? fs::path(source.substr(7)) : fs::path(source);
  std::error_code ec;
  if (!fs::exists(path, ec)) return {"repo " + source + " does not exist on the kiln server", "repo"};
  git_repository* raw = nullptr;
  if (git_repository_open_ext(&raw, path.c_str(), GIT_REPOSITORY_OPEN_NO_SEARCH, nullptr) != 0)
    return {why("repo " + source + " is not a git repository"), "repo"};
  Repo repo(raw);
  if (git_repository_is_shallow(repo.get()) == 1)
    return {"repo " + source + " is a shallow repository (cloned with --depth), so its history is incomplete; "
            "give the full repository, or run `git fetch --unshallow` in it first", "repo"};
  if (git_repository_is_empty(repo.get()) == 1) return {"repo " + source + " is empty: it has no commits", "repo"};
  // A ref is checked only when it is a plain name (no revision syntax such as ~, ^, @{…}, :/…,
  // which could also walk the whole history on this request's thread) and not a pseudo-ref
  // (FETCH_HEAD…) the clone makes itself. The clone resolves it as origin/<ref>, a tag, then a
  // revision in the clone, where the source's branch b is origin/b (also remotes/origin/b,
  // refs/remotes/origin/b) and its HEAD is origin, origin/HEAD.
  std::vector<std::string> candidates;
  if (ref.empty()) {
    candidates = {"HEAD"};
  } else {
    if (ref.find_first_of("~^:@{}[]?*\\ \t") != std::string::npos) return {};
    if (ref.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == std::string::npos) return {};
    candidates = {"refs/heads/" + ref, "refs/tags/" + ref, ref};
    for (const char* prefix : {"refs/remotes/origin/", "remotes/origin/", "origin/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) != 0) continue;
      const std::string rest = ref.substr(p.size());
      candidates.push_back(rest == "HEAD" ? std::string("HEAD") : "refs/heads/" + rest);
    }
    if (ref == "origin" || ref == "remotes/origin" || ref == "refs/remotes/origin") candidates.push_back("HEAD");
  }
  if (Commit commit = first_commit(repo.get(), candidates)) {
    if (std::string reserved = reserved_path_error(commit.get(), source); !reserved.empty()) return {reserved, "repo"};
    return {};
  }
  if (ref.empty()) return {"repo " + source + ": its HEAD does not point to a commit", "repo"};
  return {"ref '" + ref + "' was not found in " + source + " (tried a branch, a tag and a commit id)", "ref"};
}

GitOutcome<CloneInfo> git_clone_workspace(const std::string& source, const std::string& ref, const fs::path& dest,
                                          const std::string& build_id) {
  init_once();
  GitOutcome<CloneInfo> out;
  std::string branch = "kiln/" + build_id;
  int valid = 0;
  if (build_id.empty() || git_reference_name_is_valid(&valid, ("refs/heads/" + branch).c_str()) != 0 || !valid) {
    out.error = "build id '" + build_id + "' does not make a valid branch name";
    return out;
  }
  std::error_code ec;
  if (fs::exists(dest, ec) && !fs::is_empty(dest, ec)) {
    out.error = "workspace " + dest.string() + " already exists and is not empty";
    return out;
  }
  std::string url = source;
  if (fs::exists(source, ec)) url = fs::absolute(source).string();  // a local path
  {
    // A shallow source lacks the history below its cut: a clone of it is broken (libgit2 does
    // not carry .git/shallow over). Refused here with the cause rather than half-cloned.
    fs::path local = url.rfind("file://", 0) == 0 ? fs::path(url.substr(7)) : fs::path(url);
    if (fs::exists(local / ".git" / "shallow", ec) || fs::exists(local / "shallow", ec)) {
      out.error = "cannot clone " + source + ": it is a shallow repository (cloned with --depth), so its history is "
                  "incomplete; give the full repository, or run `git fetch --unshallow` in it first";
      return out;
    }
  }
  git_clone_options options = GIT_CLONE_OPTIONS_INIT;
  options.checkout_opts.checkout_strategy = GIT_CHECKOUT_NONE;  // checked out below, at `ref`
  // Never copy or hard-link a local source's objects directory: one with alternates (`--shared`,
  // `--reference`) would leave a pointer to a host path the sandbox cannot see. Fetching packs a
  // self-contained copy.
  options.local = GIT_CLONE_NO_LOCAL;
  git_repository* raw = nullptr;
  if (git_clone(&raw, url.c_str(), dest.c_str(), &options) != 0) return failure<CloneInfo>("cannot clone " + source);
  Repo repo(raw);
  std::string error;
  Commit commit = resolve_commit(repo.get(), ref, error);
  if (!commit) {
    git_strarray refs = {nullptr, 0};
    bool empty = git_reference_list(&refs, repo.get()) == 0 && refs.count == 0;
    git_strarray_dispose(&refs);
    out.error = empty ? "repository " + source + " is empty (it has no commits); there is nothing to build on"
                      : error + " (" + source + ")";
    return out;
  }
  if (std::string reserved = reserved_path_error(commit.get(), source); !reserved.empty()) {
    out.error = reserved;  // before the checkout: nothing of it reaches the workspace
    return out;
  }
  git_checkout_options checkout = GIT_CHECKOUT_OPTIONS_INIT;
  checkout.checkout_strategy = GIT_CHECKOUT_FORCE;
  if (git_checkout_tree(repo.get(), reinterpret_cast<git_object*>(commit.get()), &checkout) != 0) {
    return failure<CloneInfo>("cannot check out " + (ref.empty() ? std::string("HEAD") : ref));
  }
  // The clone made a local branch for the source's default branch; one named `kiln` or `kiln/<id>`
  // would collide with refs/heads/kiln/<id>. The build needs no local branch but its own, so HEAD
  // is detached and every other local branch deleted (the remote-tracking refs stay).
  if (git_repository_set_head_detached(repo.get(), git_commit_id(commit.get())) != 0) {
    return failure<CloneInfo>("cannot detach HEAD of " + dest.string());
  }
  {
    git_branch_iterator* it_raw = nullptr;
    if (git_branch_iterator_new(&it_raw, repo.get(), GIT_BRANCH_LOCAL) != 0) return failure<CloneInfo>("cannot list branches");
    BranchIterator it(it_raw);
    git_reference* local = nullptr;
    git_branch_t type;
    while (git_branch_next(&local, &type, it.get()) == 0) {
      Reference owned_local(local);
      if (git_branch_delete(local) != 0) return failure<CloneInfo>("cannot delete clone-local branch " + std::string(git_reference_name(local)));
    }
  }
  git_reference* branch_raw = nullptr;
  if (git_branch_create(&branch_raw, repo.get(), branch.c_str(), commit.get(), 0) != 0) {
    return failure<CloneInfo>("cannot create branch " + branch);
  }
  Reference branch_ref(branch_raw);
  if (git_repository_set_head(repo.get(), ("refs/heads/" + branch).c_str()) != 0) {
    return failure<CloneInfo>("cannot switch HEAD to " + branch);
  }
  if (std::string error = update_submodules(repo.get()); !error.empty()) {
    out.error = error + " (" + source + ")";
    return out;
  }
  std::string base = hex(git_commit_id(commit.get()));
  git_config* cfg_raw = nullptr;
  if (git_repository_config(&cfg_raw, repo.get()) != 0) return failure<CloneInfo>("cannot open config of " + dest.string());
  Config cfg(cfg_raw);
  if (git_config_set_string(cfg.get(), "kiln.base", base.c_str()) != 0) return failure<CloneInfo>("cannot record kiln.base");
  fs::path exclude = dest / ".git" / "info" / "exclude";
  fs::create_directories(exclude.parent_path(), ec);
  // Untracked caches that running a project's tests leaves behind (Python bytecode, test and type
  // caches, installed packages) belong to no change; a repository without its own .gitignore
  // would otherwise commit them. Tracked files are not affected by exclude.
  std::ofstream(exclude, std::ios::app) << "\n# kiln's own files (saved command output, the sandbox $HOME)\n/.kiln/\n"
                                           "# caches and installs that builds leave behind\n__pycache__/\n*.py[cod]\n"
                                           ".pytest_cache/\n.mypy_cache/\n.ruff_cache/\nnode_modules/\n.venv/\n";
  out.value = {base, branch};
  return out;
}

GitOutcome<std::vector<StatusEntry>> git_status(const fs::path& workspace) {
  GitOutcome<std::vector<StatusEntry>> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  git_status_options options = GIT_STATUS_OPTIONS_INIT;
  options.show = GIT_STATUS_SHOW_INDEX_AND_WORKDIR;
  options.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED | GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS | GIT_STATUS_OPT_RENAMES_HEAD_TO_INDEX;
  git_status_list* raw = nullptr;
  if (git_status_list_new(&raw, repo.get(), &options) != 0) return failure<std::vector<StatusEntry>>("cannot read status of " + workspace.string());
  StatusList list(raw);
  for (std::size_t i = 0; i < git_status_list_entrycount(list.get()); ++i) {
    const git_status_entry* e = git_status_byindex(list.get(), i);
    const git_diff_delta* delta = e->head_to_index != nullptr ? e->head_to_index : e->index_to_workdir;
    if (delta == nullptr || e->status == GIT_STATUS_CURRENT || (e->status & GIT_STATUS_IGNORED)) continue;
    unsigned s = e->status;
    std::string what = (s & (GIT_STATUS_WT_NEW | GIT_STATUS_INDEX_NEW))                ? "new"
                       : (s & (GIT_STATUS_WT_DELETED | GIT_STATUS_INDEX_DELETED))       ? "deleted"
                       : (s & (GIT_STATUS_WT_RENAMED | GIT_STATUS_INDEX_RENAMED))       ? "renamed"
                       : (s & (GIT_STATUS_WT_TYPECHANGE | GIT_STATUS_INDEX_TYPECHANGE)) ? "typechange"
                                                                                         : "modified";
    out.value.push_back({delta->new_file.path != nullptr ? delta->new_file.path : delta->old_file.path, what});
  }
  return out;
}

GitOutcome<std::string> git_diff(const fs::path& workspace, const std::string& base_commit) {
  GitOutcome<std::string> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  std::string base = base_commit;
  if (base.empty()) {
    git_config* cfg_raw = nullptr;
    git_buf value = GIT_BUF_INIT;
    if (git_repository_config_snapshot(&cfg_raw, repo.get()) != 0) return failure<std::string>("cannot read config of " + workspace.string());
    Config cfg(cfg_raw);
    if (git_config_get_string_buf(&value, cfg.get(), "kiln.base") != 0) return failure<std::string>("no kiln.base recorded in " + workspace.string() + " (not cloned by kiln?)");
    base = value.ptr;
    git_buf_dispose(&value);
  }
  git_object* obj = nullptr;
  if (git_revparse_single(&obj, repo.get(), base.c_str()) != 0) return failure<std::string>("base commit " + base + " not found");
  Object owned(obj);
  git_object* tree_raw = nullptr;
  if (git_object_peel(&tree_raw, obj, GIT_OBJECT_TREE) != 0) return failure<std::string>("base " + base + " has no tree");
  Tree tree(reinterpret_cast<git_tree*>(tree_raw));
  git_diff_options options = GIT_DIFF_OPTIONS_INIT;
  // SHOW_BINARY: a binary change is kept as a git binary patch (applies with `git apply`), not
  // reduced to "Binary files differ".
  options.flags = GIT_DIFF_INCLUDE_UNTRACKED | GIT_DIFF_RECURSE_UNTRACKED_DIRS | GIT_DIFF_SHOW_UNTRACKED_CONTENT |
                  GIT_DIFF_SHOW_BINARY;
  ::git_diff* diff_raw = nullptr;
  if (git_diff_tree_to_workdir_with_index(&diff_raw, repo.get(), tree.get(), &options) != 0) {
    return failure<std::string>("cannot diff " + workspace.string() + " against " + base);
  }
  Diff diff(diff_raw);
  git_buf buf = GIT_BUF_INIT;
  if (git_diff_to_buf(&buf, diff.get(), GIT_DIFF_FORMAT_PATCH) != 0) return failure<std::string>("cannot format the diff");
  out.value.assign(buf.ptr, buf.size);
  git_buf_dispose(&buf);
  return out;
}

namespace {
struct AddAllScan {
  fs::path root;
  std::vector<std::string>* nested = nullptr;
};

// git_index_add_all callback: a directory holding its own repository (the agent's `git init`, a
// test fixture) cannot be staged ("invalid path 'dir/'") and is not part of this repository's
// change: skipped (> 0) and named, so the rest is committed.
int skip_nested_repositories(const char* path, const char*, void* payload) {
  auto* scan = static_cast<AddAllScan*>(payload);
  std::string p = path;
  std::error_code ec;
  fs::path dir = scan->root / (p.empty() || p.back() != '/' ? p : p.substr(0, p.size() - 1));
  if (!(p.empty() || p.back() == '/') && !fs::is_directory(fs::symlink_status(dir, ec))) return 0;
  if (!fs::exists(fs::symlink_status(dir / ".git", ec))) return 0;
  if (scan->nested != nullptr) scan->nested->push_back(p.empty() || p.back() == '/' ? p : p + "/");
  return 1;
}
}  // namespace

GitOutcome<std::string> git_commit_all(const fs::path& workspace, const std::string& message,
                                       std::vector<std::string>* nested_repos) {
  GitOutcome<std::string> out;
  if (message.empty()) {
    out.error = "commit message is empty";
    return out;
  }
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  // A submodule's own files are its repository's, not this one's: committing here would keep
  // only its commit id, and the edit would be lost while verify (which sees the tree) passed.
  std::vector<std::string> submodules;
  if (git_submodule_foreach(repo.get(), collect_submodule, &submodules) == 0) {
    std::string changed;
    for (const std::string& name : submodules) {
      unsigned int status = 0;
      if (git_submodule_status(&status, repo.get(), name.c_str(), GIT_SUBMODULE_IGNORE_UNTRACKED) != 0) continue;
      if (status & (GIT_SUBMODULE_STATUS_WD_MODIFIED | GIT_SUBMODULE_STATUS_WD_INDEX_MODIFIED |
                    GIT_SUBMODULE_STATUS_WD_WD_MODIFIED))
        changed += (changed.empty() ? "" : ", ") + name;
    }
    if (!changed.empty()) {
      out.error = "files inside submodule(s) " + changed +
                  " were changed: kiln commits this repository, not its submodules, so the change cannot be kept";
      return out;
    }
  }
  git_index* index_raw = nullptr;
  if (git_repository_index(&index_raw, repo.get()) != 0) return failure<std::string>("cannot open index of " + workspace.string());
  Index index(index_raw);
  char star[] = "*";
  char* patterns[] = {star};
  git_strarray all = {patterns, 1};
  std::vector<std::string> nested;
  AddAllScan scan{workspace, &nested};
  int added = git_index_add_all(index.get(), &all, GIT_INDEX_ADD_DEFAULT, skip_nested_repositories, &scan);
  if (nested_repos != nullptr) *nested_repos = nested;
  if (added != 0 ||
      git_index_update_all(index.get(), &all, nullptr, nullptr) != 0 || git_index_write(index.get()) != 0) {
    return failure<std::string>("cannot stage changes in " + workspace.string());
  }
  git_oid tree_id;
  if (git_index_write_tree(&tree_id, index.get()) != 0) return failure<std::string>("cannot write tree");
  git_tree* tree_raw = nullptr;
  if (git_tree_lookup(&tree_raw, repo.get(), &tree_id) != 0) return failure<std::string>("cannot read new tree");
  Tree tree(tree_raw);
  Commit parent;
  git_object* head = nullptr;
  if (git_revparse_single(&head, repo.get(), "HEAD^{commit}") == 0) parent.reset(reinterpret_cast<git_commit*>(head));
  if (parent && git_oid_equal(git_commit_tree_id(parent.get()), &tree_id)) {
    out.error = "nothing to commit in " + workspace.string() + ": the tree equals HEAD's";
    return out;
  }
  git_signature* sig_raw = nullptr;
  if (git_signature_now(&sig_raw, "kiln", "kiln@localhost") != 0) return failure<std::string>("cannot make signature");
  Signature sig(sig_raw);
  const git_commit* parents[] = {parent.get()};
  git_oid commit_id;
  if (git_commit_create(&commit_id, repo.get(), "HEAD", sig.get(), sig.get(), nullptr, message.c_str(), tree.get(),
                        parent ? 1 : 0, parents) != 0) {
    return failure<std::string>("cannot commit in " + workspace.string());
  }
  out.value = hex(&commit_id);
  return out;
}

GitOutcome<std::string> git_head_commit(const fs::path& workspace) {
  GitOutcome<std::string> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  git_oid id;
  if (git_reference_name_to_id(&id, repo.get(), "HEAD") != 0) return failure<std::string>("HEAD of " + workspace.string());
  out.value = hex(&id);
  return out;
}

GitOutcome<std::string> git_current_branch(const fs::path& workspace) {
  GitOutcome<std::string> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  git_reference* head = nullptr;
  if (git_repository_head(&head, repo.get()) != 0) return failure<std::string>("HEAD of " + workspace.string());
  Reference owned(head);
  const char* name = nullptr;
  if (git_branch_name(&name, head) != 0) return failure<std::string>("HEAD of " + workspace.string() + " is not a branch");
  out.value = name;
  return out;
}

GitOutcome<std::string> git_push_branch(const fs::path& workspace, const std::string& branch, const fs::path& bare_repo) {
  GitOutcome<std::string> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  std::error_code ec;
  fs::create_directories(bare_repo.parent_path(), ec);
  git_repository* bare_raw = nullptr;
  // Opens an existing one too (re-init keeps what is there).
  if (git_repository_init(&bare_raw, bare_repo.c_str(), /*is_bare=*/1) != 0)
    return failure<std::string>("cannot create the results repository " + bare_repo.string());
  Repo bare(bare_raw);
  git_remote* remote_raw = nullptr;
  if (git_remote_create_anonymous(&remote_raw, repo.get(), bare_repo.c_str()) != 0)
    return failure<std::string>("cannot open " + bare_repo.string() + " as a remote");
  Remote remote(remote_raw);
  // Forced: a resumed build pushes its own branch again.
  std::string spec = "+refs/heads/" + branch + ":refs/heads/" + branch;
  char* specs[] = {spec.data()};
  git_strarray refspecs = {specs, 1};
  git_push_options options = GIT_PUSH_OPTIONS_INIT;
  if (git_remote_push(remote.get(), &refspecs, &options) != 0)
    return failure<std::string>("cannot push " + branch + " to " + bare_repo.string());
  git_oid id;
  if (git_reference_name_to_id(&id, bare.get(), ("refs/heads/" + branch).c_str()) != 0)
    return failure<std::string>(branch + " is missing in " + bare_repo.string() + " after the push");
  out.value = hex(&id);
  return out;
}

GitOutcome<std::vector<std::string>> git_reset_clean(const fs::path& workspace) {
  GitOutcome<std::vector<std::string>> out;
  Repo repo = open_repo(workspace, out.error);
  if (!repo) return out;
  git_object* head = nullptr;
  if (git_revparse_single(&head, repo.get(), "HEAD^{commit}") != 0) return failure<std::vector<std::string>>("HEAD of " + workspace.string());
  Object owned(head);
  git_checkout_options checkout = GIT_CHECKOUT_OPTIONS_INIT;
  checkout.checkout_strategy = GIT_CHECKOUT_FORCE;
  if (git_reset(repo.get(), head, GIT_RESET_HARD, &checkout) != 0) return failure<std::vector<std::string>>("cannot reset " + workspace.string() + " to HEAD");
  git_status_options options = GIT_STATUS_OPTIONS_INIT;
  options.show = GIT_STATUS_SHOW_WORKDIR_ONLY;
  options.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED;  // an untracked directory comes as one entry
  git_status_list* raw = nullptr;
  if (git_status_list_new(&raw, repo.get(), &options) != 0) return failure<std::vector<std::string>>("cannot read status of " + workspace.string());
  StatusList list(raw);
  for (std::size_t i = 0; i < git_status_list_entrycount(list.get()); ++i) {
    const git_status_entry* e = git_status_byindex(list.get(), i);
    if (!(e->status & GIT_STATUS_WT_NEW) || e->index_to_workdir == nullptr) continue;
    std::string path = e->index_to_workdir->new_file.path;
    std::string error;
    if (!remove_tree(workspace / path, &error)) {
      out.error = "cannot remove " + path + " from " + workspace.string() + ": " + error;
      return out;
    }
    out.value.push_back(path);
  }
  return out;
}

bool remove_tree(const fs::path& path, std::string* error) {
  std::error_code ec;
  // A command may leave directories without write (or search) permission; as a non-root kiln
  // remove_all would then fail on their entries. Owner rwx on every directory first.
  auto status = fs::symlink_status(path, ec);
  if (ec || !fs::exists(status)) return true;
  if (fs::is_directory(status)) {
    ::chmod(path.c_str(), 0700);
    for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0700);
    }
    ec.clear();
  }
  fs::remove_all(path, ec);
  if (ec && error != nullptr) *error = ec.message();
  return !ec;
}

}  // namespace kiln::tools
