#include "tools/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "sandbox/sandbox.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

bool is_within(const fs::path& root, const fs::path& path) {
  auto r = root.begin(), p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (p == path.end() || *r != *p) return false;
  }
  return true;
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

Outcome<ResolvedPath> resolve_in_workspace(const fs::path& workspace, const std::string& path, Access access) {
  Outcome<ResolvedPath> out;
  if (path.empty()) {
    out.error = "path is empty";
    return out;
  }
  if (path.find('\0') != std::string::npos) {
    out.error = "path contains a NUL byte";
    return out;
  }
  std::error_code ec;
  fs::path root = fs::canonical(workspace, ec);
  if (ec) {
    out.error = "workspace " + workspace.string() + " is not accessible: " + ec.message();
    return out;
  }
  fs::path given(path);
  fs::path relative;
  const fs::path mount(sandbox::kWorkspaceMount);
  if (given.is_absolute()) {
    fs::path normal = given.lexically_normal();
    if (is_within(mount, normal)) {
      relative = normal.lexically_relative(mount);
    } else if (is_within(root, normal)) {
      relative = normal.lexically_relative(root);
    } else if (is_within(workspace.lexically_normal(), normal)) {
      relative = normal.lexically_relative(workspace.lexically_normal());
    } else {
      out.error = "path " + path + " is outside the workspace; use a path relative to /workspace";
      return out;
    }
  } else {
    relative = given.lexically_normal();
  }
  if (relative.empty()) relative = ".";
  if (!relative.empty() && *relative.begin() == "..") {
    out.error = "path " + path + " leaves the workspace (`..` above /workspace is not allowed)";
    return out;
  }
  // Resolve symlinks in every existing component; the result must still be inside the workspace.
  fs::path real = fs::weakly_canonical(root / relative, ec);
  if (ec) {
    out.error = "cannot resolve path " + path + ": " + ec.message();
    return out;
  }
  if (!is_within(root, real)) {
    out.error = "path " + path + " resolves (through a symlink) to " + real.string() + ", outside the workspace; refused";
    return out;
  }
  fs::path shown = real.lexically_relative(root);
  if (access == Access::write && !shown.empty() && *shown.begin() == ".git") {
    out.error = "path " + path + " is inside .git; the repository is managed by kiln, not edited directly";
    return out;
  }
  out.value = {real, shown.empty() ? "." : shown.string()};
  return out;
}

Outcome<std::string> read_bytes(const fs::path& path, std::size_t max_bytes) {
  Outcome<std::string> out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    out.error = "cannot open " + path.string() + ": " + std::strerror(errno);
    return out;
  }
  FdCloser closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    out.error = path.string() + " is not a regular file";
    return out;
  }
  if (static_cast<std::size_t>(st.st_size) > max_bytes) {
    out.error = path.string() + " is " + std::to_string(st.st_size) + " bytes, over the " + std::to_string(max_bytes) + "-byte limit for this tool";
    return out;
  }
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  out.value = std::move(bytes);
  return out;
}

Outcome<bool> write_bytes(const fs::path& workspace, const fs::path& path, const std::string& bytes) {
  Outcome<bool> out;
  struct stat root_st {};
  if (stat(workspace.c_str(), &root_st) != 0) {
    out.error = "workspace " + workspace.string() + ": " + std::strerror(errno);
    return out;
  }
  bool root = geteuid() == 0;
  // Missing parents, created one by one so each gets the workspace's owner.
  std::vector<fs::path> missing;
  for (fs::path dir = path.parent_path(); !fs::exists(dir); dir = dir.parent_path()) missing.push_back(dir);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) {
      out.error = "cannot create directory " + it->string() + ": " + std::strerror(errno);
      return out;
    }
    if (root && lchown(it->c_str(), root_st.st_uid, root_st.st_gid) != 0) {
      out.error = "cannot chown " + it->string() + ": " + std::strerror(errno);
      return out;
    }
  }
  struct stat old {};
  bool exists = lstat(path.c_str(), &old) == 0;
  if (exists && !S_ISREG(old.st_mode)) {
    out.error = path.string() + " exists and is not a regular file";
    return out;
  }
  std::mt19937_64 rng(std::random_device{}());
  fs::path temp = path.parent_path() / (".kiln-tmp-" + std::to_string(rng()) + "-" + path.filename().string());
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    out.error = "cannot create " + temp.string() + ": " + std::strerror(errno);
    return out;
  }
  {
    FdCloser closer{fd};
    std::size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        out.error = "cannot write " + path.string() + ": " + std::strerror(errno);
        unlink(temp.c_str());
        return out;
      }
      done += static_cast<std::size_t>(n);
    }
    uid_t uid = exists ? old.st_uid : root_st.st_uid;
    gid_t gid = exists ? old.st_gid : root_st.st_gid;
    if (root) (void)!fchown(fd, uid, gid);
    if (exists) fchmod(fd, old.st_mode & 07777);
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    out.error = "cannot replace " + path.string() + ": " + std::strerror(errno);
    unlink(temp.c_str());
    return out;
  }
  out.value = true;
  return out;
}

bool looks_binary(const std::string& bytes) {
  return bytes.find('\0', 0) < std::min<std::size_t>(bytes.size(), 8192);
}

std::string valid_utf8(const std::string& text) { return sandbox::valid_utf8(text); }

}  // namespace kiln::tools
