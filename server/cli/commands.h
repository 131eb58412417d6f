// The kiln command line: one CLI11 app, subcommands added by the folder that owns them.
// Contract: each add_* function attaches its subcommands to `parent`; a subcommand's callback
// writes to ctx.out / ctx.err (never std::cout directly, so tests can capture) and sets
// ctx.exit_code (0 ok, 1 the operation failed, 2 usage error or not implemented).
#pragma once

#include <iosfwd>

namespace CLI {
class App;
}

namespace kiln::cli {

struct Context {
  std::ostream& out;
  std::ostream& err;
  int exit_code = 0;
};

// Prints "kiln <what>: not implemented yet" and sets exit code 2.
void not_implemented(Context& ctx, const char* what);

void add_serve_command(CLI::App& app, Context& ctx);        // server/cli/serve_command.cpp
void add_client_commands(CLI::App& app, Context& ctx);      // submit, logs, builds, cancel, compare
void add_engine_commands(CLI::App& engine, Context& ctx);   // engine info|plan|logits|generate|make-tiny|bench
void add_tokenizer_commands(CLI::App& engine, Context& ctx);  // engine tokenize|render
void add_sandbox_commands(CLI::App& app, Context& ctx);     // sandbox probe|run

}  // namespace kiln::cli
