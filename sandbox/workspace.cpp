// The workspace as the sandboxed uid sees it: ownership, $HOME, reachability; and request checks.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "sandbox/output_capture.h"
#include "sandbox/runner_internal.h"

namespace kiln::sandbox {

namespace fs = std::filesystem;

namespace {

// Can `uid`/`gid` enter directory `dir`? (mode bits only; kiln is root, so access() would lie.)
bool searchable_by(const fs::path& dir, uid_t uid, gid_t gid) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return false;
  if (st.st_uid == uid) return st.st_mode & S_IXUSR;
  if (st.st_gid == gid) return st.st_mode & S_IXGRP;
  return st.st_mode & S_IXOTH;
}

std::string give_to(const fs::path& path, const Policy& policy) {
  if (lchown(path.c_str(), policy.uid, policy.gid) != 0) {
    return "cannot chown " + path.string() + " to uid " + std::to_string(policy.uid) + ": " + std::strerror(errno);
  }
  return "";
}

}  // namespace

std::string check_request(const std::vector<std::string>& argv, const Policy& policy) {
  if (argv.empty() || argv[0].empty()) return "command: empty";
  if (policy.workspace.empty()) return "policy.workspace: empty";
  if (!policy.workspace.is_absolute()) return "policy.workspace: not an absolute path: " + policy.workspace.string();
  std::error_code ec;
  if (!fs::is_directory(policy.workspace, ec)) return "workspace " + policy.workspace.string() + ": not a directory";
  const Limits& l = policy.limits;
  if (l.wall_timeout.count() <= 0) return "limits.wall_timeout: must be > 0";
  if (l.max_processes == 0) return "limits.max_processes: must be > 0";
  if (l.memory_bytes < (16u << 20)) return "limits.memory_bytes: below 16 MiB, nothing could start";
  if (geteuid() == 0 && policy.mode == Mode::bwrap) {
    for (fs::path dir = policy.workspace; ; dir = dir.parent_path()) {
      if (!searchable_by(dir, policy.uid, policy.gid)) {
        return "workspace " + policy.workspace.string() + ": directory " + dir.string() +
               " is not searchable by sandbox uid " + std::to_string(policy.uid) +
               " (put workspaces under a directory with mode 755)";
      }
      if (dir == dir.root_path()) break;
    }
  }
  return "";
}

std::string find_bwrap(const Policy& policy) {
  if (!policy.bwrap_path.empty()) return access(policy.bwrap_path.c_str(), X_OK) == 0 ? policy.bwrap_path.string() : "";
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / "bwrap";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

std::string resolve_on_path(const std::string& command) {
  if (command.find('/') != std::string::npos) return access(command.c_str(), X_OK) == 0 ? command : "";
  for (const char* dir : {"/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"}) {
    fs::path candidate = fs::path(dir) / command;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

namespace {

// A real directory at `dir` (not a symlink: commands own the workspace and may have put a link to
// elsewhere there, which kiln, often root, must not create into or chown). Anything else found
// there is removed first.
std::string ensure_real_dir(const fs::path& dir, const Policy& policy) {
  struct stat st {};
  if (lstat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "";
    std::error_code ec;
    fs::remove_all(dir, ec);  // a symlink is removed itself, never its target
    if (ec) return "cannot remove " + dir.string() + " (not a directory): " + ec.message();
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return "cannot create " + dir.string() + ": " + std::strerror(errno);
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return dir.string() + ": not a directory after creating it";
  if (geteuid() == 0) return give_to(dir, policy);
  return "";
}

}  // namespace

std::string ensure_home(const Policy& policy) {
  if (auto e = ensure_real_dir(policy.workspace / ".kiln", policy); !e.empty()) return e;
  return ensure_real_dir(policy.workspace / ".kiln" / "home", policy);
}

std::string prepare_workspace(const Policy& policy) {
  if (std::string e = check_request({"true"}, policy); !e.empty()) return e;
  if (std::string e = ensure_home(policy); !e.empty()) return e;
  if (geteuid() != 0) return "";  // the command runs as kiln's own uid, which owns the tree already
  if (auto e = give_to(policy.workspace, policy); !e.empty()) return e;
  std::error_code ec;
  fs::recursive_directory_iterator it(policy.workspace, fs::directory_options::none, ec), end;
  if (ec) return "cannot walk " + policy.workspace.string() + ": " + ec.message();
  for (; it != end; it.increment(ec)) {
    if (ec) return "cannot walk " + policy.workspace.string() + ": " + ec.message();
    // .git stays kiln's: commands see it read-only (and, unmapped, as the overflow uid).
    if (it.depth() == 0 && it->path().filename() == ".git") {
      it.disable_recursion_pending();
      continue;
    }
    if (auto e = give_to(it->path(), policy); !e.empty()) return e;
  }
  return "";
}

std::string valid_utf8(const std::string& text) {
  // nlohmann's serializer already knows how to replace invalid sequences with U+FFFD; reuse it.
  std::string dumped = nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(dumped).get<std::string>();
}

std::string Result::joined_output() const {
  std::string_view all(output);
  return join_with_marker(all.substr(0, head_bytes), all.substr(head_bytes), dropped_bytes);
}

nlohmann::json Result::to_json() const {
  nlohmann::json j = {
      {"ok", ok()},
      {"exit_code", exit_code},
      {"signal", signal},
      {"timed_out", timed_out},
      {"cancelled", cancelled},
      {"output", valid_utf8(joined_output())},
      {"total_output_bytes", total_output_bytes},
      {"dropped_bytes", dropped_bytes},
      {"wall_seconds", wall_seconds},
      {"cpu_seconds", cpu_seconds},
      {"peak_rss_bytes", peak_rss_bytes},
      {"enforced", enforced},
      {"unsandboxed", unsandboxed},
  };
  if (!ok()) j["error"] = error;
  return j;
}

}  // namespace kiln::sandbox
