// `kiln serve`: the HTTP API, the dispatcher and the workers in one process.
#include <CLI/CLI.hpp>

#include <memory>

#include "server/cli/commands.h"
#include "server/health_server.h"

namespace kiln::cli {

namespace {
struct ServeOptions {
  std::string listen = "127.0.0.1:8080";
  std::string db = "var/kiln.db";
  std::string config;
  int workers = 0;
};
}  // namespace

void add_serve_command(CLI::App& app, Context& ctx) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* serve = app.add_subcommand("serve", "Run the kiln server (HTTP API, queue, workers, engine)");
  serve->add_option("--listen", options->listen, "host:port to listen on")->capture_default_str();
  serve->add_option("--db", options->db, "SQLite database file")->capture_default_str();
  serve->add_option("--config", options->config, "JSON configuration file (models, limits)");
  serve->add_option("--workers", options->workers, "Worker threads (0 = one per engine session slot)")
      ->check(CLI::NonNegativeNumber);
  serve->callback([&ctx, options] {
    server::ListenAddress address;
    std::string error;
    if (!server::parse_listen_address(options->listen, address, error)) {
      ctx.err << "kiln serve: --listen: " << error << "\n";
      ctx.exit_code = 2;
      return;
    }
    ctx.exit_code = server::serve_health_only(address, ctx.err);
  });
}

}  // namespace kiln::cli
