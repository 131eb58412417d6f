// `kiln sandbox probe|run`: check what isolation this host gives, run one command as a build would.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <ostream>

#include "sandbox/sandbox.h"
#include "server/cli/commands.h"

namespace kiln::cli {

namespace {

struct SandboxOptions {
  bool json = false;
  std::string workspace;
  double timeout_s = 60;
  std::uint64_t memory_bytes = 0;
  std::uint64_t max_processes = 0;
  std::string mode = "bwrap";
  std::vector<std::string> command;
};

void do_probe(Context& ctx, const SandboxOptions& o) {
  sandbox::ProbeReport report = sandbox::probe(sandbox::Policy{});
  if (o.json) {
    ctx.out << report.to_json().dump(2) << "\n";
  } else {
    ctx.out << report.to_text();
  }
  ctx.exit_code = report.usable ? 0 : 1;
}

void do_run(Context& ctx, const SandboxOptions& o) {
  sandbox::Policy policy;
  std::error_code ec;
  policy.workspace = std::filesystem::absolute(o.workspace, ec);
  if (o.timeout_s <= 0) {
    ctx.err << "kiln sandbox run: --timeout must be > 0\n";
    ctx.exit_code = 2;
    return;
  }
  policy.limits.wall_timeout = std::chrono::milliseconds(static_cast<long long>(o.timeout_s * 1000));
  if (o.memory_bytes > 0) policy.limits.memory_bytes = o.memory_bytes;
  if (o.max_processes > 0) policy.limits.max_processes = o.max_processes;
  if (o.mode == "none") {
    policy.mode = sandbox::Mode::none;
    ctx.err << "WARNING: --sandbox=none: the command runs WITHOUT isolation (development only)\n";
  }
  if (std::string e = sandbox::prepare_workspace(policy); !e.empty()) {
    ctx.err << "kiln sandbox run: " << e << "\n";
    ctx.exit_code = 1;
    return;
  }
  sandbox::Result r = sandbox::run(o.command, policy);
  ctx.out << r.to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!r.ok()) ctx.err << "kiln sandbox run: " << r.error << "\n";
  ctx.exit_code = r.ok() ? 0 : 1;
}

}  // namespace

void add_sandbox_commands(CLI::App& app, Context& ctx) {
  auto options = std::make_shared<SandboxOptions>();
  CLI::App* sandbox = app.add_subcommand("sandbox", "Probe and exercise the command sandbox");
  CLI::App* probe = sandbox->add_subcommand("probe", "Print which isolation layers work on this host (exit 1 if builds could not run)");
  probe->add_flag("--json", options->json, "Print the report as JSON");
  probe->callback([&ctx, options] { do_probe(ctx, *options); });

  CLI::App* run = sandbox->add_subcommand(
      "run", "Run one command in the sandbox exactly as a build would, print the result as JSON. "
             "DIR becomes a build workspace: under root it is given to the sandbox uid (65534).");
  run->add_option("--workspace", options->workspace, "Directory bound read-write at /workspace")->required()->check(CLI::ExistingDirectory);
  run->add_option("--timeout", options->timeout_s, "Wall-clock limit in seconds")->capture_default_str();
  run->add_option("--memory", options->memory_bytes, "Address-space / cgroup memory limit in bytes (default 4 GiB)");
  run->add_option("--max-processes", options->max_processes, "Process limit (default 256)");
  run->add_option("--sandbox", options->mode, "bwrap (default) or none (development only, NO isolation)")
      ->check(CLI::IsMember({"bwrap", "none"}));
  run->add_option("command", options->command, "The command and its arguments, after --")->required();
  run->callback([&ctx, options] { do_run(ctx, *options); });
}

}  // namespace kiln::cli
