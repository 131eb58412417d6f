// Client subcommands that talk to a running kiln server over HTTP.
#include <CLI/CLI.hpp>

#include "server/cli/commands.h"

namespace kiln::cli {

void add_client_commands(CLI::App& app, Context& ctx) {
  struct Stub {
    const char* name;
    const char* help;
  };
  static const Stub stubs[] = {
      {"submit", "Submit a build: a repository and a coding task"},
      {"logs", "Print (or follow) the event log of a build"},
      {"builds", "List builds"},
      {"cancel", "Cancel a queued or running build"},
      {"compare", "Compare build duration and success across models"},
  };
  for (const Stub& stub : stubs) {
    CLI::App* sub = app.add_subcommand(stub.name, stub.help);
    sub->allow_extras();
    const char* name = stub.name;
    sub->callback([&ctx, name] { not_implemented(ctx, name); });
  }
}

}  // namespace kiln::cli
