// Per-command cgroups: where a cgroup hierarchy is mounted and writable (v2 with the memory and
// pids controllers delegated, or v1 `memory` / `pids`), each command gets its own group with a
// memory limit and a process limit, under kiln's own group. Detection runs once per process.
// A CommandCgroup is owned by the thread running its command.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::sandbox {

struct CgroupSupport {
  bool v2 = false;                       // memory+pids limits through one v2 group
  std::filesystem::path v2_parent;
  bool v1_memory = false;
  std::filesystem::path v1_memory_parent;
  bool v1_pids = false;
  std::filesystem::path v1_pids_parent;
  std::string detail;                    // what was found, for the probe

  bool memory() const { return v2 || v1_memory; }
  bool pids() const { return v2 || v1_pids; }
  static const CgroupSupport& get();     // detected once, thread-safe
};

class CommandCgroup {
 public:
  CommandCgroup() = default;
  CommandCgroup(const CommandCgroup&) = delete;
  CommandCgroup& operator=(const CommandCgroup&) = delete;
  ~CommandCgroup();  // kills what is left and removes the groups

  // Creates the groups and writes the limits; "" on success, else a message naming the file.
  std::string create(std::uint64_t memory_bytes, std::uint64_t max_processes);
  // Files the child writes "0" to (before dropping privileges) to join the groups.
  const std::vector<std::string>& procs_files() const { return procs_files_; }
  void signal_all(int sig) const;   // every process in the groups
  std::vector<pid_t> members() const;
  std::uint64_t peak_memory_bytes() const;  // 0 when unknown
  std::vector<std::string> enforced() const;  // e.g. {"cgroup v1 memory", "cgroup v1 pids"}

 private:
  std::vector<std::filesystem::path> dirs_;
  std::vector<std::string> procs_files_;
  std::filesystem::path memory_dir_;
  bool v2_ = false;
};

}  // namespace kiln::sandbox
