// Resolving the model's paths inside the workspace, and byte-exact file I/O for the tools.
// Internal to tools/.
#pragma once

#include <filesystem>
#include <string>

#include "tools/git.h"  // GitOutcome, reused as the general outcome type

namespace kiln::tools {

template <class T>
using Outcome = GitOutcome<T>;

struct ResolvedPath {
  std::filesystem::path host;  // real path on the host, symlinks resolved, inside the workspace
  std::string shown;           // path relative to the workspace, for messages ("." for the root)
};

enum class Access { read, write };

// Accepts relative paths, /workspace/... (what the model sees in bash) and absolute host paths
// inside the workspace. Refuses: empty paths, absolute paths elsewhere, `..` that climbs out,
// symlinks (anywhere on the path) that lead out, and writes under .git.
Outcome<ResolvedPath> resolve_in_workspace(const std::filesystem::path& workspace, const std::string& path, Access access);

// Whole file as bytes (no newline or encoding translation). Refuses files over max_bytes.
Outcome<std::string> read_bytes(const std::filesystem::path& path, std::size_t max_bytes = 16u << 20);

// Replaces the file's bytes atomically (temp file + rename) keeping the old file's mode and owner;
// a new file gets mode 0644 and the owner of the workspace root (the sandbox uid), so commands in
// the sandbox can go on editing it. Creates missing parent directories the same way. `path` must
// lie under `workspace`; it is reached from the workspace root one directory at a time without
// following a symlink, so a directory the sandbox replaced with a link is refused, not written
// through.
Outcome<bool> write_bytes(const std::filesystem::path& workspace, const std::filesystem::path& path, const std::string& bytes);

// True when the text looks binary (a NUL byte in its first 8 KiB).
bool looks_binary(const std::string& bytes);

// Replaces invalid UTF-8 with U+FFFD so text can go into JSON and the prompt.
std::string valid_utf8(const std::string& text);

}  // namespace kiln::tools
