#include "sandbox/cgroup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace kiln::sandbox {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// Mount points of cgroup hierarchies from /proc/self/mountinfo: "cgroup2" or a v1 controller.
fs::path mount_of(const std::string& what) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, dev, root, mountpoint, fstype, source, options;
    pre >> id >> parent >> dev >> root >> mountpoint;
    post >> fstype >> source >> options;
    if (what == "cgroup2" && fstype == "cgroup2") return mountpoint;
    if (fstype == "cgroup") {
      std::istringstream opts(options);
      std::string opt;
      while (std::getline(opts, opt, ',')) {
        if (opt == what) return mountpoint;
      }
    }
  }
  return {};
}

// Our own group in a hierarchy from /proc/self/cgroup ("" key = v2).
std::string own_group(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':');
    auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controller.empty() ? controllers.empty() && line.compare(0, a, "0") == 0
                           : ("," + controllers + ",").find("," + controller + ",") != std::string::npos) {
      return path;
    }
  }
  return {};
}

// A probe group can be made (and removed) under parent.
bool can_create_child(const fs::path& parent) {
  fs::path probe = parent / ("kiln-probe-" + std::to_string(getpid()));
  std::error_code ec;
  if (!fs::create_directory(probe, ec) || ec) return false;
  fs::remove(probe, ec);
  return true;
}

std::atomic<unsigned> g_sequence{0};

}  // namespace

const CgroupSupport& CgroupSupport::get() {
  static const CgroupSupport support = [] {
    CgroupSupport s;
    std::ostringstream detail;
    fs::path v2 = mount_of("cgroup2");
    if (!v2.empty()) {
      fs::path parent = v2 / own_group("").substr(1);
      std::string controllers = read_file(parent / "cgroup.subtree_control");
      bool delegated = controllers.find("memory") != std::string::npos &&
                       controllers.find("pids") != std::string::npos;
      s.v2 = delegated && can_create_child(parent);
      s.v2_parent = parent;
      detail << "cgroup2 at " << parent.string() << (s.v2 ? " (memory+pids delegated, writable)" : " (memory/pids not delegated or not writable)") << "; ";
    }
    for (const char* controller : {"memory", "pids"}) {
      fs::path mount = mount_of(controller);
      if (mount.empty()) {
        detail << "v1 " << controller << ": not mounted; ";
        continue;
      }
      std::string group = own_group(controller);
      fs::path parent = mount / (group.empty() ? "" : group.substr(1));
      bool ok = !s.v2 && can_create_child(parent);
      (std::string(controller) == "memory" ? s.v1_memory : s.v1_pids) = ok;
      (std::string(controller) == "memory" ? s.v1_memory_parent : s.v1_pids_parent) = parent;
      detail << "v1 " << controller << " at " << parent.string() << (ok ? " (writable)" : s.v2 ? " (v2 used)" : " (not writable)") << "; ";
    }
    s.detail = detail.str();
    return s;
  }();
  return support;
}

std::string CommandCgroup::create(std::uint64_t memory_bytes, std::uint64_t max_processes) {
  const CgroupSupport& s = CgroupSupport::get();
  std::string name = "kiln-" + std::to_string(getpid()) + "-" + std::to_string(g_sequence++);
  auto make = [&](const fs::path& parent) -> std::string {
    fs::path dir = parent / name;
    std::error_code ec;
    fs::create_directory(dir, ec);
    if (ec) return "cannot create cgroup " + dir.string() + ": " + ec.message();
    dirs_.push_back(dir);
    return "";
  };
  if (s.v2) {
    if (auto e = make(s.v2_parent); !e.empty()) return e;
    v2_ = true;
    memory_dir_ = dirs_.back();
    if (!write_file(memory_dir_ / "memory.max", std::to_string(memory_bytes))) return "cannot write " + (memory_dir_ / "memory.max").string();
    write_file(memory_dir_ / "memory.swap.max", "0");  // absent without swap accounting: fine
    if (!write_file(memory_dir_ / "pids.max", std::to_string(max_processes))) return "cannot write " + (memory_dir_ / "pids.max").string();
    procs_files_.push_back((memory_dir_ / "cgroup.procs").string());
    return "";
  }
  if (s.v1_memory) {
    if (auto e = make(s.v1_memory_parent); !e.empty()) return e;
    memory_dir_ = dirs_.back();
    if (!write_file(memory_dir_ / "memory.limit_in_bytes", std::to_string(memory_bytes))) return "cannot write " + (memory_dir_ / "memory.limit_in_bytes").string();
    procs_files_.push_back((memory_dir_ / "cgroup.procs").string());
  }
  if (s.v1_pids) {
    if (auto e = make(s.v1_pids_parent); !e.empty()) return e;
    if (!write_file(dirs_.back() / "pids.max", std::to_string(max_processes))) return "cannot write " + (dirs_.back() / "pids.max").string();
    procs_files_.push_back((dirs_.back() / "cgroup.procs").string());
  }
  return "";
}

std::vector<pid_t> CommandCgroup::members() const {
  std::vector<pid_t> out;
  for (const auto& dir : dirs_) {
    std::istringstream procs(read_file(dir / "cgroup.procs"));
    pid_t pid;
    while (procs >> pid) out.push_back(pid);
  }
  return out;
}

void CommandCgroup::signal_all(int sig) const {
  for (pid_t pid : members()) kill(pid, sig);
}

std::uint64_t CommandCgroup::peak_memory_bytes() const {
  if (memory_dir_.empty()) return 0;
  std::string text = read_file(memory_dir_ / (v2_ ? "memory.peak" : "memory.max_usage_in_bytes"));
  try {
    return text.empty() ? 0 : std::stoull(text);
  } catch (...) {
    return 0;
  }
}

std::vector<std::string> CommandCgroup::enforced() const {
  const CgroupSupport& s = CgroupSupport::get();
  if (dirs_.empty()) return {};
  if (v2_) return {"cgroup v2 memory", "cgroup v2 pids"};
  std::vector<std::string> out;
  if (s.v1_memory) out.emplace_back("cgroup v1 memory");
  if (s.v1_pids) out.emplace_back("cgroup v1 pids");
  return out;
}

CommandCgroup::~CommandCgroup() {
  // The command is over; anything still in the groups is a leftover: kill it, then remove the
  // groups (rmdir fails while members are still exiting, so retry briefly).
  for (const auto& dir : dirs_) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      signal_all(SIGKILL);
      if (rmdir(dir.c_str()) == 0 || errno == ENOENT) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace kiln::sandbox
