// Client subcommands that talk to a running kiln server over HTTP:
//   kiln submit --repo R --task T [--verify V] [--model M] [--follow]
//   kiln logs ID [--follow]      kiln builds      kiln cancel ID      kiln compare --models a,b [--since T]
// Every one takes --server URL (default $KILN_SERVER or http://127.0.0.1:8080) and --token
// (default $KILN_TOKEN). Exit codes: 0 ok (for --follow: the build succeeded), 1 failure, 2 usage.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/cli/commands.h"
#include "server/client.h"

namespace kiln::cli {

using nlohmann::json;

namespace {

struct Common {
  std::string server;
  std::string token;
};

void add_common(CLI::App* sub, Common& c) {
  sub->add_option("--server", c.server, "Server URL (default $KILN_SERVER or http://127.0.0.1:8080)");
  sub->add_option("--token", c.token, "Bearer token (default $KILN_TOKEN)");
}

// Builds a client from the options, or reports a usage error.
std::optional<server::Client> make_client(const Common& c, Context& ctx, const char* cmd) {
  std::string url = c.server;
  if (url.empty()) url = std::getenv("KILN_SERVER") ? std::getenv("KILN_SERVER") : "http://127.0.0.1:8080";
  std::string token = c.token;
  if (token.empty() && std::getenv("KILN_TOKEN")) token = std::getenv("KILN_TOKEN");
  server::ServerUrl parsed;
  if (auto err = server::parse_server_url(url, parsed)) {
    ctx.err << "kiln " << cmd << ": --server: " << *err << "\n";
    ctx.exit_code = 2;
    return std::nullopt;
  }
  return server::Client(parsed, token);
}

// One JSON call; prints the error and sets exit 1 unless the status is in [200, 300).
std::optional<json> call(const server::Client& client, Context& ctx, const char* cmd, const std::string& method,
                         const std::string& target, const std::string& body = {}) {
  server::ClientResponse res;
  if (auto err = client.request(method, target, body, res)) {
    ctx.err << "kiln " << cmd << ": " << *err << "\n";
    ctx.exit_code = 1;
    return std::nullopt;
  }
  if (res.status < 200 || res.status >= 300) {
    ctx.err << "kiln " << cmd << ": HTTP " << res.status << ": " << server::api_error_message(res) << "\n";
    ctx.exit_code = 1;
    return std::nullopt;
  }
  json j = json::parse(res.body, nullptr, false);
  if (j.is_discarded()) {
    ctx.err << "kiln " << cmd << ": the server sent invalid JSON\n";
    ctx.exit_code = 1;
    return std::nullopt;
  }
  return j;
}

// Streams a build's log from after_seq to its end, reconnecting (with Last-Event-ID) when the
// connection drops. Returns the terminal status, or "" on a permanent failure.
std::string follow(const server::Client& client, Context& ctx, const char* cmd, int64_t id, int64_t after_seq) {
  std::string target = "/v1/builds/" + std::to_string(id) + "/events";
  std::string final_status, final_detail;
  int failures = 0;
  while (final_status.empty()) {
    auto err = client.stream(target, after_seq, [&](const server::SseMessage& m) {
      if (m.event == "end") {
        json end = json::parse(m.data, nullptr, false);
        final_status = end.is_object() ? end.value("status", "unknown") : "unknown";
        if (end.is_object() && end.contains("reason") && end["reason"].is_string())
          final_detail = " (" + end["reason"].get<std::string>() + ")";
        if (end.is_object() && end.contains("error_message") && end["error_message"].is_string())
          final_detail += ": " + end["error_message"].get<std::string>();
        return server::StreamControl::stop;
      }
      if (m.event == "error") {
        ctx.err << "kiln " << cmd << ": server: " << server::terminal_safe(m.data) << "\n";
        return server::StreamControl::keep_going;
      }
      json ev = json::parse(m.data, nullptr, false);
      if (!ev.is_discarded()) ctx.out << server::format_event_line(ev) << "\n" << std::flush;
      if (m.id) after_seq = *m.id;
      failures = 0;
      return server::StreamControl::keep_going;
    });
    if (!final_status.empty()) break;
    if (err && err->rfind("HTTP 4", 0) == 0) {  // the build does not exist, bad token...: no retry
      ctx.err << "kiln " << cmd << ": " << *err << "\n";
      return "";
    }
    if (++failures > 30) {
      ctx.err << "kiln " << cmd << ": giving up: " << (err ? *err : std::string("stream keeps closing")) << "\n";
      return "";
    }
    ctx.err << "kiln " << cmd << ": reconnecting after seq " << after_seq << (err ? " (" + *err + ")" : "") << "\n";
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5000, 200 * failures)));
  }
  ctx.out << "build " << id << " " << final_status << server::terminal_safe(final_detail) << "\n";
  return final_status;
}

std::string fmt_seconds(const json& v) {
  if (!v.is_number()) return "-";
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << v.get<double>() << "s";
  return s.str();
}

}  // namespace

void add_client_commands(CLI::App& app, Context& ctx) {
  // submit
  {
    struct O : Common {
      std::string repo, ref, task, verify, model;
      int64_t steps = 0, tokens = 0, wall = 0, priority = 0;
      bool follow = false;
    };
    auto o = std::make_shared<O>();
    CLI::App* sub = app.add_subcommand("submit", "Submit a build: a repository and a coding task");
    sub->add_option("--repo", o->repo, "Repository URL or local path")->required();
    sub->add_option("--task", o->task, "What the agent should do")->required();
    sub->add_option("--ref", o->ref, "Branch, tag or commit (default: the default branch)");
    sub->add_option("--verify", o->verify, "Shell command that decides success (e.g. 'make test')");
    sub->add_option("--model", o->model, "Model name (default: the server's default model)");
    sub->add_option("--steps", o->steps, "Step limit")->check(CLI::PositiveNumber);
    sub->add_option("--tokens", o->tokens, "Generated-token limit")->check(CLI::PositiveNumber);
    sub->add_option("--wall-seconds", o->wall, "Wall-time limit")->check(CLI::PositiveNumber);
    sub->add_option("--priority", o->priority, "Higher runs first");
    sub->add_flag("--follow,-f", o->follow, "Stream the log until the build ends (exit 0 if it succeeded)");
    add_common(sub, *o);
    sub->callback([&ctx, o] {
      auto client = make_client(*o, ctx, "submit");
      if (!client) return;
      // A local path is resolved here: the server's working directory is not the caller's.
      std::string repo = o->repo;
      std::error_code ec;
      if (repo.find("://") == std::string::npos && std::filesystem::exists(repo, ec))
        repo = std::filesystem::absolute(repo, ec).lexically_normal().string();
      json body = {{"repo", repo}, {"task", o->task}};
      if (!o->ref.empty()) body["ref"] = o->ref;
      if (!o->verify.empty()) body["verify"] = o->verify;
      if (!o->model.empty()) body["model"] = o->model;
      if (o->priority != 0) body["priority"] = o->priority;
      json limits = json::object();
      if (o->steps > 0) limits["steps"] = o->steps;
      if (o->tokens > 0) limits["tokens"] = o->tokens;
      if (o->wall > 0) limits["wall_seconds"] = o->wall;
      if (!limits.empty()) body["limits"] = limits;
      auto build = call(*client, ctx, "submit", "POST", "/v1/builds", body.dump());
      if (!build) return;
      int64_t id = (*build)["id"].get<int64_t>();
      ctx.out << id << "\n" << std::flush;
      if (!o->follow) return;
      std::string status = follow(*client, ctx, "submit", id, 0);
      ctx.exit_code = status == "succeeded" ? 0 : 1;
    });
  }
  // logs
  {
    struct O : Common {
      int64_t id = 0;
      int64_t after = 0;
      bool follow = false;
    };
    auto o = std::make_shared<O>();
    CLI::App* sub = app.add_subcommand("logs", "Print (or follow) the event log of a build");
    sub->add_option("id", o->id, "Build id")->required()->check(CLI::PositiveNumber);
    sub->add_option("--after", o->after, "Start after this event seq");
    sub->add_flag("--follow,-f", o->follow, "Keep streaming until the build ends (resumes after drops)");
    add_common(sub, *o);
    sub->callback([&ctx, o] {
      auto client = make_client(*o, ctx, "logs");
      if (!client) return;
      if (o->follow) {
        std::string status = follow(*client, ctx, "logs", o->id, o->after);
        ctx.exit_code = status == "succeeded" ? 0 : 1;
        return;
      }
      int64_t after = o->after;
      for (;;) {
        auto page = call(*client, ctx, "logs", "GET",
                         "/v1/builds/" + std::to_string(o->id) + "/events?limit=1000&after=" + std::to_string(after));
        if (!page) return;
        for (const json& ev : (*page)["events"]) ctx.out << server::format_event_line(ev) << "\n";
        if ((*page)["events"].size() < 1000) break;
        after = (*page)["next_after"].get<int64_t>();
      }
    });
  }
  // builds
  {
    struct O : Common {
      std::string status, model;
      int limit = 20;
    };
    auto o = std::make_shared<O>();
    CLI::App* sub = app.add_subcommand("builds", "List builds, newest first");
    sub->add_option("--status", o->status, "Only builds with this status");
    sub->add_option("--model", o->model, "Only builds of this model");
    sub->add_option("--limit", o->limit, "How many")->check(CLI::Range(1, 1000))->capture_default_str();
    add_common(sub, *o);
    sub->callback([&ctx, o] {
      auto client = make_client(*o, ctx, "builds");
      if (!client) return;
      std::string target = "/v1/builds?limit=" + std::to_string(o->limit);
      if (!o->status.empty()) target += "&status=" + server::url_encode(o->status);
      if (!o->model.empty()) target += "&model=" + server::url_encode(o->model);
      auto page = call(*client, ctx, "builds", "GET", target);
      if (!page) return;
      ctx.out << std::left << std::setw(8) << "ID" << std::setw(11) << "STATUS" << std::setw(15) << "REASON"
              << std::setw(20) << "MODEL" << std::setw(9) << "TIME" << "TASK\n";
      for (const json& b : (*page)["builds"]) {
        std::string task = b.value("task", "");
        for (char& c : task) c = c == '\n' || c == '\t' ? ' ' : c;
        if (task.size() > 50) task = server::cut_utf8(task, 47) + "...";
        task = server::terminal_safe(task);
        ctx.out << std::left << std::setw(8) << b["id"].get<int64_t>() << std::setw(11) << b.value("status", "")
                << std::setw(15) << (b["reason"].is_string() ? b["reason"].get<std::string>() : "-")
                << std::setw(20) << b.value("model", "") << std::setw(9)
                << fmt_seconds(b.contains("duration_s") ? b["duration_s"] : json()) << task << "\n";
      }
    });
  }
  // cancel
  {
    struct O : Common {
      int64_t id = 0;
    };
    auto o = std::make_shared<O>();
    CLI::App* sub = app.add_subcommand("cancel", "Cancel a queued or running build");
    sub->add_option("id", o->id, "Build id")->required()->check(CLI::PositiveNumber);
    add_common(sub, *o);
    sub->callback([&ctx, o] {
      auto client = make_client(*o, ctx, "cancel");
      if (!client) return;
      auto reply = call(*client, ctx, "cancel", "POST", "/v1/builds/" + std::to_string(o->id) + "/cancel");
      if (!reply) return;
      ctx.out << "build " << o->id << ": "
              << ((*reply)["immediate"].get<bool>() ? "cancelled" : "cancel requested (the worker stops at its next heartbeat)")
              << "\n";
    });
  }
  // compare
  {
    struct O : Common {
      std::string models;
      std::string since;
    };
    auto o = std::make_shared<O>();
    CLI::App* sub = app.add_subcommand("compare", "Compare build duration and success across models");
    sub->add_option("--models", o->models, "Comma-separated model names (default: all)");
    sub->add_option("--since", o->since,
                    "Only builds finished since this time: RFC 3339 (2026-01-31T12:00:00Z) or unix seconds");
    add_common(sub, *o);
    sub->callback([&ctx, o] {
      auto client = make_client(*o, ctx, "compare");
      if (!client) return;
      std::string query;
      if (!o->models.empty()) query += "&models=" + server::url_encode(o->models);
      if (!o->since.empty()) query += "&since=" + server::url_encode(o->since);
      if (!query.empty()) query[0] = '?';
      auto report = call(*client, ctx, "compare", "GET", "/v1/compare" + query);
      if (!report) return;
      ctx.out << std::left << std::setw(24) << "MODEL" << std::right << std::setw(7) << "BUILDS" << std::setw(9)
              << "SUCCESS" << std::setw(10) << "MEDIAN" << std::setw(10) << "P90" << std::setw(12) << "TOKENS"
              << std::setw(10) << "TOK/S" << "\n";
      // A value the server could not compute (no builds, no successes) is null: shown as "-".
      auto number = [](const json& v, int precision, double scale = 1, const char* unit = "") {
        if (!v.is_number()) return std::string("-");
        std::ostringstream s;
        s << std::fixed << std::setprecision(precision) << scale * v.get<double>() << unit;
        return s.str();
      };
      for (const json& m : (*report)["models"]) {
        ctx.out << std::left << std::setw(24) << m.value("model", "") << std::right << std::setw(7)
                << m.value("builds", int64_t{0}) << std::setw(9) << number(m["success_rate"], 0, 100, "%")
                << std::setw(10) << fmt_seconds(m["median_wall_s"]) << std::setw(10) << fmt_seconds(m["p90_wall_s"])
                << std::setw(12) << number(m["median_tokens_generated"], 0) << std::setw(10)
                << number(m["decode_tokens_per_s"], 1) << "\n";
      }
      ctx.out << "(MEDIAN and P90: wall time of succeeded builds; cancelled builds and kiln's own failures are left out)\n";
      if (!(*report)["pairs"].empty()) ctx.out << "\n";
      for (const json& p : (*report)["pairs"]) {
        ctx.out << p.value("model_a", "") << " vs " << p.value("model_b", "") << ": " << p.value("tasks", int64_t{0})
                << " shared tasks, both ok " << p.value("both_succeeded", int64_t{0}) << ", only A "
                << p.value("only_a", int64_t{0}) << ", only B " << p.value("only_b", int64_t{0}) << ", both failed "
                << p.value("both_failed", int64_t{0}) << ", McNemar p=" << std::setprecision(3)
                << p.value("mcnemar_p", 1.0);
        if (p["median_wall_ratio"].is_number())
          ctx.out << ", median time ratio A/B " << std::setprecision(2) << p["median_wall_ratio"].get<double>();
        ctx.out << "\n";
      }
    });
  }
}

}  // namespace kiln::cli
