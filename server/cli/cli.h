// Entry point of the kiln command line, separate from main() so tests can drive it.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kiln::cli {

// Parses `args` (args[0] is the program name) and runs the chosen subcommand.
// Returns the process exit code: 0 success, 1 failure, 2 usage error / not implemented.
int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kiln::cli
