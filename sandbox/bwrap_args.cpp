// The policy → bwrap argument vector, as a pure function so tests can read it without running it.
#include <unistd.h>

#include <system_error>

#include "sandbox/sandbox.h"

namespace kiln::sandbox {

namespace fs = std::filesystem;

HostLayout HostLayout::detect(const Policy& policy) {
  HostLayout layout;
  // Merged-/usr hosts (Debian 12) have /bin, /lib... as symlinks into /usr; older ones have dirs.
  for (const char* path : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    auto status = fs::symlink_status(path, ec);
    if (ec) continue;
    if (fs::is_symlink(status)) {
      layout.symlinks.emplace_back(path, fs::read_symlink(path, ec).string());
    } else if (fs::is_directory(status)) {
      layout.directories.emplace_back(path);
    }
  }
  for (const char* path : {"/usr", "/etc", "/opt"}) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) layout.directories.emplace_back(path);
  }
  std::error_code ec;
  layout.has_git_dir = fs::exists(policy.workspace / ".git", ec);
  bool root = geteuid() == 0;
  layout.run_uid = root ? policy.uid : getuid();
  layout.run_gid = root ? policy.gid : getgid();
  return layout;
}

std::vector<std::pair<std::string, std::string>> sandbox_env(const Policy& policy) {
  std::string ws = kWorkspaceMount;
  std::vector<std::pair<std::string, std::string>> env = {
      {"HOME", ws + "/.kiln/home"},
      {"PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"},
      {"PAGER", "cat"},
      {"GIT_PAGER", "cat"},
      {"GIT_TERMINAL_PROMPT", "0"},
      {"CI", "1"},
      {"TERM", "dumb"},
      {"LANG", "C.UTF-8"},
      {"TMPDIR", "/tmp"},
      {"DEBIAN_FRONTEND", "noninteractive"},
  };
  for (const auto& kv : policy.extra_env) env.push_back(kv);
  return env;
}

std::vector<std::string> bwrap_args(const Policy& policy, const HostLayout& layout,
                                    const std::vector<std::string>& argv) {
  const std::string ws = kWorkspaceMount;
  std::vector<std::string> a = {
      "--unshare-all",      // user, ipc, pid, net (loopback only), uts, cgroup namespaces
      "--die-with-parent",  // if kiln (or the watchdog's SIGKILL) takes bwrap down, the tree goes too
      "--new-session",      // no controlling terminal to inject input into
      "--cap-drop", "ALL",
      "--uid", std::to_string(layout.run_uid),
      "--gid", std::to_string(layout.run_gid),
      "--hostname", "kiln-sandbox",
  };
  for (const auto& dir : layout.directories) {
    a.insert(a.end(), {"--ro-bind", dir, dir});
  }
  for (const auto& [path, target] : layout.symlinks) {
    a.insert(a.end(), {"--symlink", target, path});
  }
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev"});
  a.insert(a.end(), {"--size", std::to_string(policy.limits.tmp_bytes), "--tmpfs", "/tmp"});
  a.insert(a.end(), {"--bind", policy.workspace.string(), ws});
  if (layout.has_git_dir) {
    // Later mounts shadow earlier ones: .git is read-only even though the workspace is not.
    a.insert(a.end(), {"--ro-bind", (policy.workspace / ".git").string(), ws + "/.git"});
  }
  a.insert(a.end(), {"--remount-ro", "/"});  // nothing outside /workspace and /tmp is writable
  a.insert(a.end(), {"--chdir", ws, "--clearenv"});
  for (const auto& [name, value] : sandbox_env(policy)) {
    a.insert(a.end(), {"--setenv", name, value});
  }
  a.emplace_back("--");
  a.insert(a.end(), argv.begin(), argv.end());
  return a;
}

}  // namespace kiln::sandbox
