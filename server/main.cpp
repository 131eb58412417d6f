// The kiln binary: everything lives in the kiln_server library; main only hands over argv.
#include <iostream>
#include <string>
#include <vector>

#include "server/cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  return kiln::cli::run(args, std::cout, std::cerr);
}
