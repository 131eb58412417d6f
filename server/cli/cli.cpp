#include "server/cli/cli.h"

#include <CLI/CLI.hpp>

#include <ostream>

#include "server/cli/commands.h"

namespace kiln::cli {

void not_implemented(Context& ctx, const char* what) {
  ctx.err << "kiln " << what << ": not implemented yet\n";
  ctx.exit_code = 2;
}

namespace {

// CLI11 writes help through its formatter; we route it to our stream.
int print_help(const CLI::App& app, std::ostream& out) {
  out << app.help();
  return 0;
}

// Finds the deepest subcommand that was parsed, so "kiln engine --help" prints engine's help.
const CLI::App* deepest_parsed(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (sub->parsed()) return deepest_parsed(*sub);
  }
  return &app;
}

// "kiln", "kiln engine", "kiln engine logits": how the user typed the command.
std::string command_path(const CLI::App& app) {
  const CLI::App* parent = app.get_parent();
  return parent == nullptr ? std::string("kiln") : command_path(*parent) + " " + app.get_name();
}

}  // namespace

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Context ctx{out, err};
  CLI::App app{"kiln: long autonomous coding builds on an in-process LLM engine", "kiln"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
  // Command groups do not use require_subcommand: CLI11 would then report "a subcommand is
  // required" for `kiln frobnicate` instead of naming the unknown word (see below).

  add_serve_command(app, ctx);
  add_client_commands(app, ctx);
  CLI::App* engine = app.add_subcommand("engine", "Inspect and run models in the in-process engine");
  add_engine_commands(*engine, ctx);
  add_tokenizer_commands(*engine, ctx);
  add_sandbox_commands(app, ctx);

  std::vector<std::string> rest(args.size() > 1 ? args.begin() + 1 : args.end(), args.end());
  std::vector<std::string> reversed(rest.rbegin(), rest.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return print_help(*deepest_parsed(app), out);
  } catch (const CLI::CallForAllHelp&) {
    return print_help(app, out);
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return 0;
  } catch (const CLI::ExtrasError& e) {
    // Extras are checked before any callback runs, so nothing has started yet.
    const CLI::App* where = deepest_parsed(app);
    std::string path = command_path(*where);
    std::vector<std::string> left = where->remaining();
    if (!where->get_subcommands({}).empty() && !left.empty() && left.front().rfind("-", 0) != 0) {
      err << path << ": unknown command '" << left.front() << "'\n";
    } else {
      err << path << ": " << e.what() << "\n";
    }
    err << "Run '" << path << " --help' for usage.\n";
    return 2;
  } catch (const CLI::RequiredError& e) {
    err << "kiln: " << e.what() << "\n";
    err << "Run 'kiln --help' for usage.\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    err << "kiln: " << e.what() << "\n";
    return 2;
  }
  const CLI::App* where = deepest_parsed(app);
  if (!where->get_subcommands({}).empty()) {  // a command group was named without one of its commands
    std::string path = command_path(*where);
    err << path << ": a command is required\n";
    err << "Run '" << path << " --help' for the list of commands.\n";
    return 2;
  }
  return ctx.exit_code;
}

}  // namespace kiln::cli
