// Pieces of run() split out to keep runner.cpp readable; internal to sandbox/.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "sandbox/cgroup.h"
#include "sandbox/sandbox.h"

namespace kiln::sandbox {

// "" when argv/policy can be run, else what is wrong (naming the field or path).
std::string check_request(const std::vector<std::string>& argv, const Policy& policy);
// policy.bwrap_path, or the first executable `bwrap` on kiln's PATH; "" if none.
std::string find_bwrap(const Policy& policy);
// Looks a command up on the sandbox's standard PATH (Mode::none); "" if not found.
std::string resolve_on_path(const std::string& command);
// Creates <workspace>/.kiln/home (the command's $HOME), owned by the sandbox uid.
std::string ensure_home(const Policy& policy);

// The parent's side of a running command: reads output, enforces the wall clock and the
// cancellation flag, reaps the child. Lives on the calling thread for the duration of run().
struct Watch {
  pid_t pid;
  int out_fd;
  std::chrono::steady_clock::time_point start;
  const Policy& policy;
  const RunOptions& options;
  const CommandCgroup& cgroup;

  void loop(Result& result);
};

}  // namespace kiln::sandbox
