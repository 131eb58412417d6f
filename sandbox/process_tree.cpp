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

// ppid of pid from /proc/<pid>/stat; the comm field may contain spaces and ')' so parse from the
// last ')'.
pid_t parent_of(const char* pid_dir) {
  std::ifstream in(std::string("/proc/") + pid_dir + "/stat");
  std::string stat;
  std::getline(in, stat);
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  char state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
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
    pid_t ppid = parent_of(entry->d_name);
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
      std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
      std::string stat;
      std::getline(in, stat);
      const auto open = stat.find('('), close = stat.rfind(')');
      if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size()) continue;
      if (stat.compare(open + 1, close - open - 1, comm) == 0 && stat[close + 2] == 'Z') out.push_back(pid);
    }
  }
  return out;
}

void signal_tree(pid_t root, int sig, bool include_root) {
  if (include_root) kill(-root, sig);  // root called setsid(): its pgid is its pid
  for (pid_t pid : descendants(root)) kill(pid, sig);
}

}  // namespace kiln::sandbox
