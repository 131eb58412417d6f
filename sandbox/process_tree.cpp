#include "sandbox/process_tree.h"

#include <dirent.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

namespace kiln::sandbox {

namespace {

// comm, state and ppid of pid from /proc/<pid>/stat; the comm field may contain spaces and ')',
// so the rest is parsed from the last ')'. ppid is -1 when the process is gone.
struct ProcStat {
  std::string comm;
  char state = '?';
  pid_t ppid = -1;
};

ProcStat read_stat(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat;
  std::getline(in, stat);
  ProcStat out;
  const auto open = stat.find('('), close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return out;
  out.comm = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 1));
  rest >> out.state >> out.ppid;
  return out;
}

}  // namespace

std::vector<pid_t> descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // ppid -> pid
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc"), closedir);
  if (!dir) return {};
  while (dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    pid_t ppid = read_stat(entry->d_name).ppid;
    if (ppid > 0) children.emplace(ppid, static_cast<pid_t>(pid));
  }
  std::vector<pid_t> out;
  std::vector<pid_t> frontier = {root};
  while (!frontier.empty()) {
    pid_t p = frontier.back();
    frontier.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      out.push_back(it->second);
      frontier.push_back(it->second);
    }
  }
  return out;
}

std::vector<pid_t> zombie_children_named(const char* comm) {
  std::vector<pid_t> out;
  std::unique_ptr<DIR, int (*)(DIR*)> tasks(opendir("/proc/self/task"), closedir);
  if (!tasks) return out;
  while (dirent* task = readdir(tasks.get())) {
    if (task->d_name[0] == '.') continue;
    std::ifstream children(std::string("/proc/self/task/") + task->d_name + "/children");
    pid_t pid;
    while (children >> pid) {
      const ProcStat st = read_stat(std::to_string(pid));
      if (st.state == 'Z' && st.comm == comm) out.push_back(pid);
    }
  }
  return out;
}

void signal_tree(pid_t root, int sig, bool include_root) {
  if (include_root) kill(-root, sig);  // root called setsid(): its pgid is its pid
  for (pid_t pid : descendants(root)) kill(pid, sig);
}

}  // namespace kiln::sandbox
