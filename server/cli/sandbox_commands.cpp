// `kiln sandbox probe|run`: check what isolation this host gives, run one command as a build would.
#include <CLI/CLI.hpp>

#include "server/cli/commands.h"

namespace kiln::cli {

void add_sandbox_commands(CLI::App& app, Context& ctx) {
  CLI::App* sandbox = app.add_subcommand("sandbox", "Probe and exercise the command sandbox");
  CLI::App* probe = sandbox->add_subcommand("probe", "Print which isolation layers work on this host");
  probe->callback([&ctx] { not_implemented(ctx, "sandbox probe"); });
  CLI::App* run = sandbox->add_subcommand("run", "Run one command in the sandbox, print the result as JSON");
  run->allow_extras();
  run->callback([&ctx] { not_implemented(ctx, "sandbox run"); });
}

}  // namespace kiln::cli
