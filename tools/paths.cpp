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
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever (the model
  // can mkfifo in the workspace); it is cleared once fstat says this is a regular file.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
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
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    out.error = "cannot read " + path.string() + ": " + std::strerror(errno);
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
  std::error_code ec;
  const fs::path root_path = fs::canonical(workspace, ec);
  if (ec) {
    out.error = "workspace " + workspace.string() + ": " + ec.message();
    return out;
  }
  fs::path relative = path.lexically_normal().lexically_relative(root_path);
  if (relative.empty() || *relative.begin() == "..")  // given under the workspace as named, not canonical
    relative = path.lexically_normal().lexically_relative(workspace.lexically_normal());
  if (relative.empty() || *relative.begin() == ".." || relative.filename().empty() || relative.filename() == "." ||
      relative.filename() == "..") {
    out.error = path.string() + " is not a file path inside the workspace " + root_path.string();
    return out;
  }
  // dir_closer holds the directory reached so far, starting at the workspace root.
  FdCloser dir_closer{open(root_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir_closer.fd < 0) {
    out.error = "workspace " + root_path.string() + ": " + std::strerror(errno);
    return out;
  }
  struct stat root_st {};
  if (fstat(dir_closer.fd, &root_st) != 0) {
    out.error = "workspace " + root_path.string() + ": " + std::strerror(errno);
    return out;
  }
  const bool root = geteuid() == 0;
  // Down to the parent directory one component at a time, never through a symlink: commands in
  // the sandbox own the tree and may have replaced any directory with a link to elsewhere, and
  // kiln (root, often) must not write there. Missing directories are created as they are met,
  // owned like the workspace root.
  fs::path walked = root_path;
  for (const fs::path& part : relative.parent_path()) {
    if (part == ".") continue;
    walked /= part;
    if (mkdirat(dir_closer.fd, part.c_str(), 0755) == 0) {
      if (root && fchownat(dir_closer.fd, part.c_str(), root_st.st_uid, root_st.st_gid, AT_SYMLINK_NOFOLLOW) != 0) {
        out.error = "cannot chown " + walked.string() + ": " + std::strerror(errno);
        return out;
      }
    } else if (errno != EEXIST) {
      out.error = "cannot create directory " + walked.string() + ": " + std::strerror(errno);
      return out;
    }
    const int next = openat(dir_closer.fd, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      out.error = errno == ELOOP || errno == ENOTDIR
                      ? walked.string() + " is not a directory (a symlink or a file); refused"
                      : "cannot open directory " + walked.string() + ": " + std::strerror(errno);
      return out;
    }
    close(dir_closer.fd);
    dir_closer.fd = next;
  }
  const std::string name = relative.filename().string();
  struct stat old {};
  const bool exists = fstatat(dir_closer.fd, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && !S_ISREG(old.st_mode)) {
    out.error = path.string() + " exists and is not a regular file";
    return out;
  }
  std::mt19937_64 rng(std::random_device{}());
  const std::string temp = ".kiln-tmp-" + std::to_string(rng()) + "-" + name;
  int fd = openat(dir_closer.fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    out.error = "cannot create " + (walked / temp).string() + ": " + std::strerror(errno);
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
        unlinkat(dir_closer.fd, temp.c_str(), 0);
        return out;
      }
      done += static_cast<std::size_t>(n);
    }
    uid_t uid = exists ? old.st_uid : root_st.st_uid;
    gid_t gid = exists ? old.st_gid : root_st.st_gid;
    if (root) (void)!fchown(fd, uid, gid);
    if (exists) fchmod(fd, old.st_mode & 07777);
  }
  if (renameat(dir_closer.fd, temp.c_str(), dir_closer.fd, name.c_str()) != 0) {
    out.error = "cannot replace " + path.string() + ": " + std::strerror(errno);
    unlinkat(dir_closer.fd, temp.c_str(), 0);
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
