// `kiln serve`: the HTTP API, the event streams, the dispatcher and the workers in one process.
// Settings come from defaults, then the --config file, then the flags given on the command line.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <ostream>

#include "server/cli/commands.h"
#include "server/config.h"
#include "server/demo_model.h"
#include "server/server.h"

namespace kiln::cli {

namespace {

struct ServeOptions {
  std::string listen = "127.0.0.1:8080";
  std::string db = "var/kiln.db";
  std::string config;
  std::string token;
  int workers = 0;
  int io_threads = 2;
};
}  // namespace

void add_serve_command(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* serve = app.add_subcommand("serve", "Run the kiln server (HTTP API, queue, workers, engine)");
  serve->add_option("--config", o->config, "JSON configuration file (models, limits; see server/README.md)");
  serve->add_option("--listen", o->listen, "host:port to listen on")->capture_default_str();
  serve->add_option("--db", o->db, "SQLite database file")->capture_default_str();
  serve->add_option("--workers", o->workers, "Worker threads (0 = one per engine session slot)")
      ->check(CLI::Range(0, 4096));
  serve->add_option("--io-threads", o->io_threads, "Threads serving HTTP")->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--token", o->token,
                    "Bearer token clients must send (required off loopback; default $KILN_TOKEN)");
  serve->callback([&ctx, o, serve] {
    server::ServerConfig config;
    if (!o->config.empty()) {
      if (auto err = server::load_config_file(o->config, config)) {
        ctx.err << "kiln serve: --config: " << *err << "\n";
        ctx.exit_code = 2;
        return;
      }
    }
    if (serve->count("--listen") > 0 || o->config.empty()) {
      std::string error;
      if (!server::parse_listen_address(o->listen, config.listen, error)) {
        ctx.err << "kiln serve: --listen: " << error << "\n";
        ctx.exit_code = 2;
        return;
      }
    }
    if (serve->count("--db") > 0) config.db_path = o->db;
    if (serve->count("--workers") > 0) config.workers = o->workers;
    if (serve->count("--io-threads") > 0) config.io_threads = o->io_threads;
    if (!o->token.empty()) {
      config.token = o->token;
    } else if (const char* env = std::getenv("KILN_TOKEN"); env != nullptr && config.token.empty()) {
      config.token = env;
    }
    // A model directory that is not there would fail every build that asks for it, long after
    // start; say so now.
    for (size_t i = 0; i < config.models.size(); ++i) {
      const server::ModelConfig& m = config.models[i];
      std::error_code ec;
      if (!m.scripted_test_turns.empty() || std::filesystem::is_regular_file(std::filesystem::path(m.path) / "config.json", ec))
        continue;
      ctx.err << "kiln serve: --config: models[" << i << "].path: no config.json in '" << m.path << "' (model '"
              << m.name << "')\n";
      ctx.exit_code = 2;
      return;
    }
    if (config.models.empty()) {
      if (auto err = server::add_demo_model(config, ctx.err)) {
        ctx.err << "kiln serve: " << *err << "\n";
        ctx.exit_code = 1;
        return;
      }
    }
    std::string error;
    std::unique_ptr<server::Server> srv = server::Server::start(config, ctx.err, error);
    if (!srv) {
      ctx.err << "kiln serve: " << error << "\n";
      ctx.exit_code = 1;
      return;
    }
    srv->run_until_signal();
    ctx.exit_code = 0;
  });
}

}  // namespace kiln::cli
