// Finding and signalling every process a command started, from the host side. Used by the
// watchdog so a command that ignores SIGTERM, forks, or disowns children still goes away.
#pragma once

#include <sys/types.h>

#include <vector>

namespace kiln::sandbox {

// All descendants of `root` (not root itself), parents before children, from /proc.
std::vector<pid_t> descendants(pid_t root);

// Sends `sig` to root's process group and to each descendant (which may have left the group by
// calling setsid, as bwrap's --new-session does).
void signal_tree(pid_t root, int sig, bool include_root);

// Children of this process that are zombies named `comm`, from /proc/self/task/*/children.
std::vector<pid_t> zombie_children_named(const char* comm);

}  // namespace kiln::sandbox
