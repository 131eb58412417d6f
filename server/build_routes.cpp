// The /v1 route functions: request -> response, over the store. Validation errors name the
// field at fault in the API's own vocabulary (limits.steps, not the store's limits.max_steps).
#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "agent/worker.h"
#include "server/event_hub.h"
#include "server/http_metrics.h"
#include "server/models.h"
#include "server/routes.h"
#include "store/store.h"
#include "tools/git.h"

namespace kiln::server {

using nlohmann::json;

namespace {

std::string api_field(const std::string& store_field) {
  if (store_field == "limits.max_steps") return "limits.steps";
  if (store_field == "limits.max_tokens") return "limits.tokens";
  if (store_field == "limits.max_wall_s") return "limits.wall_seconds";
  return store_field;
}

HttpResponse store_error(const store::Error& e, const std::string& default_field = {}) {
  using store::ErrorCode;
  std::string code(store::to_string(e.code));
  switch (e.code) {
    case ErrorCode::invalid_argument: return error_response(400, "invalid_field", e.message, api_field(e.field));
    case ErrorCode::not_found: return error_response(404, "not_found", e.message, default_field);
    case ErrorCode::conflict: return error_response(409, "conflict", e.message, default_field);
    case ErrorCode::busy: {
      HttpResponse res = error_response(503, "busy", e.message);
      res.headers.emplace_back("Retry-After", "1");
      return res;
    }
    default: return error_response(500, "store_" + code, e.message);
  }
}

// Rejects query parameters the route does not know, naming the first one.
std::optional<HttpResponse> reject_unknown_params(const HttpRequest& req, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : req.query) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) return error_response(400, "unknown_parameter", "unknown query parameter '" + key + "'", key);
  }
  return std::nullopt;
}

// Reads an integer query parameter within [lo, hi]; absent leaves `out` alone.
std::optional<HttpResponse> int_param(const HttpRequest& req, const char* name, int64_t lo, int64_t hi,
                                      int64_t& out) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return std::nullopt;
  const std::string& v = it->second;
  int64_t n = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || ptr != v.data() + v.size() || n < lo || n > hi) {
    return error_response(400, "invalid_parameter",
                          std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got '" + v + "'",
                          name);
  }
  out = n;
  return std::nullopt;
}

int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {  // Howard Hinnant's algorithm
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// A JSON integer within [lo, hi]. get<int64_t>() alone would wrap an unsigned value past INT64_MAX
// (18446744073709551615 reads as -1), so those count as out of range.
bool json_integer_in(const json& v, int64_t lo, int64_t hi, int64_t& out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
  int64_t n = v.get<int64_t>();
  if (n < lo || n > hi) return false;
  out = n;
  return true;
}

// Reads exactly `n` decimal digits at text[pos].
bool digits(std::string_view text, size_t pos, size_t n, int64_t& out) {
  if (pos + n > text.size()) return false;
  out = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    out = out * 10 + (text[i] - '0');
  }
  return true;
}

// A model name to compare must be configured or have been used by some build; anything else is
// a typo that would otherwise get an all-zero report.
std::optional<HttpResponse> check_model_known(const std::string& name, App& app) {
  std::string configured;
  for (const ModelConfig& m : app.config->models) {
    if (m.name == name) return std::nullopt;
    configured += (configured.empty() ? "" : ", ") + m.name;
  }
  store::ListQuery q;
  q.model = name;
  q.limit = 1;
  auto page = app.store->list(q);
  if (!page) return store_error(page.error(), "models");
  if (!page->builds.empty()) return std::nullopt;
  return error_response(400, "invalid_parameter",
                        "unknown model '" + name + "' (configured: " + (configured.empty() ? "none" : configured) +
                            "; no build used it either)",
                        "models");
}

}  // namespace

std::optional<int64_t> parse_since(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text.find_first_not_of("0123456789") == std::string_view::npos) {  // unix seconds
    if (text.size() > 12) return std::nullopt;
    int64_t seconds = 0;
    digits(text, 0, text.size(), seconds);
    return seconds * 1000;
  }
  // RFC 3339: YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM). A space where the offset's '+' belongs
  // is read as '+': an unencoded '+' in a query string arrives as a space.
  int64_t y, mo, d, h, mi, s;
  if (!digits(text, 0, 4, y) || text.size() < 20 || text[4] != '-' || !digits(text, 5, 2, mo) || text[7] != '-' ||
      !digits(text, 8, 2, d) || (text[10] != 'T' && text[10] != 't') || !digits(text, 11, 2, h) || text[13] != ':' ||
      !digits(text, 14, 2, mi) || text[16] != ':' || !digits(text, 17, 2, s)) {
    return std::nullopt;
  }
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] + (mo == 2 && leap) || h > 23 || mi > 59 || s > 60) {
    return std::nullopt;
  }
  size_t pos = 19;
  int64_t frac_ms = 0;
  if (text[pos] == '.') {
    size_t start = ++pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (pos - start < 3) frac_ms = frac_ms * 10 + (text[pos] - '0');
      ++pos;
    }
    if (pos == start) return std::nullopt;
    for (size_t n = std::min<size_t>(pos - start, 3); n < 3; ++n) frac_ms *= 10;
  }
  int64_t offset_min = 0;
  if (pos + 1 == text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    // UTC
  } else if (pos + 6 == text.size() && (text[pos] == '+' || text[pos] == '-' || text[pos] == ' ')) {
    int64_t oh, om;
    if (!digits(text, pos + 1, 2, oh) || text[pos + 3] != ':' || !digits(text, pos + 4, 2, om) || oh > 23 || om > 59) {
      return std::nullopt;
    }
    offset_min = (text[pos] == '-' ? -1 : 1) * (oh * 60 + om);
  } else {
    return std::nullopt;
  }
  int64_t seconds = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + std::min<int64_t>(s, 59) - offset_min * 60;
  return seconds * 1000 + frac_ms;
}

json build_json(const store::Build& b) {
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  json metrics = json::parse(store::to_json(b.metrics));
  json j = {{"id", b.id},
            {"repo", b.spec.repo},
            {"ref", b.spec.ref},
            {"task", b.spec.task},
            {"verify", opt(b.spec.verify)},
            {"model", b.spec.model},
            {"limits", {{"steps", b.spec.limits.max_steps},
                        {"tokens", b.spec.limits.max_tokens},
                        {"wall_seconds", b.spec.limits.max_wall_s}}},
            {"priority", b.spec.priority},
            {"status", store::to_string(b.status)},
            {"reason", b.outcome ? json(store::to_string(*b.outcome)) : json(nullptr)},
            {"attempt", b.attempt},
            {"cancel_requested", b.cancel_requested},
            {"created_ms", b.created_ms},
            {"started_ms", opt(b.started_ms)},
            {"finished_ms", opt(b.finished_ms)},
            {"result_branch", opt(b.result_branch)},
            {"error_message", opt(b.error_message)},
            {"has_diff", b.has_diff},
            {"metrics", metrics}};
  // The build's own time over all its attempts (what compare ranks: no queue, no wait for the
  // model); finish minus the last claim only when the worker recorded none.
  if (b.metrics.seconds_wall > 0) j["duration_s"] = b.metrics.seconds_wall;
  else if (b.finished_ms && b.started_ms) j["duration_s"] = static_cast<double>(*b.finished_ms - *b.started_ms) / 1000.0;
  return j;
}

// Parses a submit body into a BuildSpec. Errors: 400 naming the field.
std::optional<HttpResponse> parse_submit(const std::string& body, const ServerConfig& config, store::BuildSpec& spec) {
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return error_response(400, "invalid_json", "request body is not valid JSON", "body");
  if (!doc.is_object()) return error_response(400, "invalid_json", "request body must be a JSON object", "body");
  static const char* known[] = {"repo", "ref", "task", "verify", "model", "limits", "priority"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) return error_response(400, "unknown_field", "unknown field '" + it.key() + "'", it.key());
  }
  auto str = [&](const char* key, bool required, std::string& out) -> std::optional<HttpResponse> {
    if (!doc.contains(key) || doc[key].is_null()) {
      if (required) return error_response(400, "missing_field", std::string(key) + " is required", key);
      return std::nullopt;
    }
    if (!doc[key].is_string()) return error_response(400, "invalid_type", std::string(key) + " must be a string", key);
    out = doc[key].get<std::string>();
    return std::nullopt;
  };
  if (auto e = str("repo", true, spec.repo)) return e;
  if (auto e = str("task", true, spec.task)) return e;
  if (auto e = str("ref", false, spec.ref)) return e;
  std::string verify;
  if (auto e = str("verify", false, verify)) return e;
  if (doc.contains("verify") && doc["verify"].is_string()) spec.verify = verify;
  if (auto e = str("model", false, spec.model)) return e;
  if (spec.model.empty()) spec.model = effective_default_model(config);
  if (spec.model.empty()) return error_response(400, "missing_field", "model is required (no default model is configured)", "model");
  spec.limits = {config.limits.steps, config.limits.tokens, config.limits.wall_seconds};
  if (doc.contains("limits") && !doc["limits"].is_null()) {
    const json& l = doc["limits"];
    if (!l.is_object()) return error_response(400, "invalid_type", "limits must be an object", "limits");
    struct LimitField {
      const char* name;
      int64_t* target;
      int64_t max;  // the store's bound (store.h), so a build it accepts never fails at the worker
    };
    const LimitField fields[] = {{"steps", &spec.limits.max_steps, store::kMaxLimitSteps},
                                 {"tokens", &spec.limits.max_tokens, store::kMaxLimitTokens},
                                 {"wall_seconds", &spec.limits.max_wall_s, store::kMaxLimitWallSeconds}};
    for (auto it = l.begin(); it != l.end(); ++it) {
      const LimitField* f = nullptr;
      for (const LimitField& candidate : fields) f = it.key() == candidate.name ? &candidate : f;
      std::string field = "limits." + it.key();
      if (f == nullptr) return error_response(400, "unknown_field", "unknown field '" + field + "'", field);
      if (!json_integer_in(*it, 1, f->max, *f->target)) {
        return error_response(400, "invalid_type", field + " must be an integer in [1, " + std::to_string(f->max) + "]",
                              field);
      }
    }
  }
  if (doc.contains("priority") && !doc["priority"].is_null()) {
    if (!json_integer_in(doc["priority"], INT64_MIN, INT64_MAX, spec.priority)) {
      return error_response(400, "invalid_type", "priority must be a 64-bit signed integer", "priority");
    }
  }
  return std::nullopt;
}

namespace {

// The source check reads the local filesystem. On the HTTP thread a hung network mount would hold
// that thread, and every request it serves, until the mount answers: the check runs on a thread
// of its own and the request waits for it at most app.source_check_wait. A check still running
// then is left to finish detached and the build is accepted unchecked: its clone reports the
// source. At most kMaxDetachedChecks checks run at once (hung or not); beyond that a request
// does not check at all.
SourceCheckResult check_source_in_time(const App& app, const std::string& repo, const std::string& ref) {
  constexpr int kMaxDetachedChecks = 8;  // threads a hung mount can hold
  static std::atomic<int> running{0};  // checks in flight, each on its own thread
  if (running.fetch_add(1) >= kMaxDetachedChecks) {
    --running;
    return {};
  }
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    SourceCheckResult result;
  };
  auto pending = std::make_shared<Pending>();
  auto check = app.source_check ? app.source_check : [](const std::string& r, const std::string& f) {
    const tools::SourceCheck c = tools::check_local_source(r, f);
    return SourceCheckResult{c.error, c.field};
  };
  try {
    std::thread([pending, check = std::move(check), repo, ref] {
      SourceCheckResult result;
      try {
        result = check(repo, ref);
      } catch (...) {  // left to the clone, like a check that did not answer
      }
      {
        std::lock_guard<std::mutex> lock(pending->mu);
        pending->result = std::move(result);
        pending->done = true;
      }
      pending->cv.notify_one();
      --running;
    }).detach();
  } catch (...) {  // no thread (or no memory for its state) to be had: accept, the clone checks
    --running;
    return {};
  }
  std::unique_lock<std::mutex> lock(pending->mu);
  if (!pending->cv.wait_for(lock, app.source_check_wait, [&] { return pending->done; })) return {};
  return pending->result;
}

}  // namespace

HttpResponse submit_build(const HttpRequest& req, App& app) {
  store::BuildSpec spec;
  if (auto err = parse_submit(req.body, *app.config, spec)) return *err;
  if (std::optional<store::Error> invalid = app.store->validate(spec)) return store_error(*invalid);
  // A local repository is checked now (milliseconds), so that a wrong path or ref is this
  // request's 400 rather than a build that errors after waiting in the queue.
  if (SourceCheckResult source = check_source_in_time(app, spec.repo, spec.ref); !source.error.empty())
    return error_response(400, "invalid_source", source.error, source.field);
  auto build = app.store->submit(spec);
  if (!build) return store_error(build.error());
  HttpResponse res = json_response(201, build_json(*build));
  res.headers.emplace_back("Location", "/v1/builds/" + std::to_string(build->id));
  return res;
}

HttpResponse list_builds(const HttpRequest& req, App& app) {
  if (auto e = reject_unknown_params(req, {"status", "model", "limit", "cursor"})) return *e;
  store::ListQuery q;
  if (auto it = req.query.find("status"); it != req.query.end() && !it->second.empty()) {
    q.status = store::parse_build_status(it->second);
    if (!q.status) {
      return error_response(400, "invalid_parameter",
                            "status must be one of queued, running, succeeded, failed, cancelled, error", "status");
    }
  }
  if (auto it = req.query.find("model"); it != req.query.end() && !it->second.empty()) q.model = it->second;
  int64_t limit = 50, cursor = 0;
  if (auto e = int_param(req, "limit", 1, 1000, limit)) return *e;
  if (auto e = int_param(req, "cursor", 1, INT64_MAX, cursor)) return *e;
  q.limit = static_cast<int>(limit);
  if (cursor > 0) q.cursor = cursor;
  auto page = app.store->list(q);
  if (!page) return store_error(page.error());
  json builds = json::array();
  for (const store::Build& b : page->builds) builds.push_back(build_json(b));
  json body = {{"builds", builds}};
  body["next_cursor"] = page->next_cursor ? json(*page->next_cursor) : json(nullptr);
  return json_response(200, body);
}

HttpResponse get_build(int64_t id, App& app) {
  auto build = app.store->get(id, /*include_diff=*/false);
  if (!build) return store_error(build.error(), "id");
  return json_response(200, build_json(*build));
}

HttpResponse cancel_build(int64_t id, App& app) {
  auto reply = app.store->cancel(id);
  if (!reply) return store_error(reply.error(), "id");
  return json_response(200, {{"build", build_json(reply->build)}, {"immediate", reply->immediate}});
}

HttpResponse get_diff(int64_t id, App& app) {
  auto build = app.store->get(id, /*include_diff=*/true);
  if (!build) return store_error(build.error(), "id");
  if (!build->result_diff) {
    return error_response(404, "no_diff",
                          "build " + std::to_string(id) + " has no diff (status " +
                              std::string(store::to_string(build->status)) + ")",
                          "id");
  }
  HttpResponse res;
  res.content_type = "text/x-diff; charset=utf-8";
  res.body = *build->result_diff;
  return res;
}

RouteResult get_events(int64_t id, const HttpRequest& req, App& app) {
  RouteResult r;
  if (auto e = reject_unknown_params(req, {"after", "limit"})) return {*e, "", std::nullopt};
  int64_t after = 0, limit = 200;
  if (auto e = int_param(req, "after", 0, INT64_MAX, after)) return {*e, "", std::nullopt};
  if (auto e = int_param(req, "limit", 1, 1000, limit)) return {*e, "", std::nullopt};
  bool sse = req.header("accept").find("text/event-stream") != std::string::npos;
  if (sse && !req.header("last-event-id").empty()) {
    const std::string& v = req.header("last-event-id");
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), after);
    if (ec != std::errc() || ptr != v.data() + v.size() || after < 0) {
      return {error_response(400, "invalid_header", "Last-Event-ID must be an event seq, got '" + v + "'",
                             "Last-Event-ID"),
              "", std::nullopt};
    }
  }
  // Status first, then events: a terminal status means the page below is complete.
  auto build = app.store->get(id, /*include_diff=*/false);
  if (!build) return {store_error(build.error(), "id"), "", std::nullopt};
  if (sse) {
    r.stream = StreamStart{id, after};
    return r;
  }
  auto events = app.store->read_events(id, after, static_cast<int>(limit));
  if (!events) return {store_error(events.error(), "id"), "", std::nullopt};
  json list = json::array();
  for (const store::Event& e : *events) list.push_back(json::parse(store::to_json(e)));
  bool terminal = store::is_terminal(build->status);
  json body = {{"events", list},
               {"next_after", events->empty() ? after : events->back().seq},
               {"status", store::to_string(build->status)},
               {"terminal", terminal && static_cast<int64_t>(events->size()) < limit}};
  r.response = json_response(200, body);
  return r;
}

HttpResponse compare_models(const HttpRequest& req, App& app) {
  if (auto e = reject_unknown_params(req, {"models", "since"})) return *e;
  store::CompareQuery q;
  if (auto it = req.query.find("since"); it != req.query.end()) {
    q.since_ms = parse_since(it->second);
    if (!q.since_ms) {
      return error_response(400, "invalid_parameter",
                            "since must be an RFC 3339 timestamp (2026-01-31T12:00:00Z) or unix seconds, got '" +
                                it->second + "'",
                            "since");
    }
  }
  if (auto it = req.query.find("models"); it != req.query.end()) {
    std::string_view rest = it->second;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string name(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (name.empty()) return error_response(400, "invalid_parameter", "models has an empty name", "models");
      if (auto e = check_model_known(name, app)) return *e;
      q.models.push_back(std::move(name));
    }
  }
  auto report = app.store->compare(q);
  if (!report) return store_error(report.error(), "models");
  HttpResponse res;
  res.body = store::to_json(*report) + "\n";
  return res;
}

HttpResponse list_models(App& app) {
  json body;
  if (app.models != nullptr) {
    body = app.models->describe(app.store);
  } else {
    body = {{"models", json::array()}};
  }
  body["default_model"] = effective_default_model(*app.config);
  return json_response(200, body);
}

HttpResponse render_metrics(App& app) {
  HttpResponse res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  std::string& out = res.body;
  if (auto stats = app.store->stats()) {
    out += "# HELP kiln_builds Builds by status.\n# TYPE kiln_builds gauge\n";
    for (const auto& [status, n] : stats->builds_by_status) {
      out += "kiln_builds{status=\"" + std::string(store::to_string(status)) + "\"} " + std::to_string(n) + "\n";
    }
    out += "# HELP kiln_queue_depth Builds waiting for a worker.\n# TYPE kiln_queue_depth gauge\n";
    out += "kiln_queue_depth " + std::to_string(stats->queue_depth) + "\n";
    out += "# HELP kiln_tokens_total Tokens over all builds, by kind.\n# TYPE kiln_tokens_total counter\n";
    std::pair<const char*, int64_t> kinds[] = {{"prefilled", stats->tokens_prefilled},
                                               {"cached", stats->tokens_cached},
                                               {"generated", stats->tokens_generated},
                                               {"reasoning", stats->tokens_reasoning}};
    for (auto& [kind, n] : kinds) out += "kiln_tokens_total{kind=\"" + std::string(kind) + "\"} " + std::to_string(n) + "\n";
  } else {
    out += "# store error: " + stats.error().message + "\n";
  }
  store::CompareQuery every_model;  // the configured ones, else all
  for (const ModelConfig& m : app.config->models) every_model.models.push_back(m.name);
  if (auto report = app.store->compare(every_model)) {
    out += "# HELP kiln_decode_tokens_per_second Decode speed over finished builds, by model.\n";
    out += "# TYPE kiln_decode_tokens_per_second gauge\n";
    for (const store::ModelStats& m : report->models) {
      if (!m.decode_tokens_per_s) continue;  // no decode yet: no sample rather than a false 0
      out += "kiln_decode_tokens_per_second{model=\"" + prometheus_label(m.model) + "\"} " +
             std::to_string(*m.decode_tokens_per_s) + "\n";
    }
  }
  // Every reason is listed (0 when it never happened) so dashboards see the family from the start.
  std::map<std::string, int64_t> failures = agent::sandbox_failure_counts();
  for (const char* reason : {"start_failed", "wall_timeout", "cpu_limit", "file_size_limit", "killed", "unusable"}) {
    failures.emplace(reason, 0);
  }
  out += "# HELP kiln_sandbox_failures_total Build commands the sandbox failed to start or killed for a limit, by reason.\n";
  out += "# TYPE kiln_sandbox_failures_total counter\n";
  for (const auto& [reason, n] : failures) {
    out += "kiln_sandbox_failures_total{reason=\"" + prometheus_label(reason) + "\"} " + std::to_string(n) + "\n";
  }
  if (app.hub != nullptr) {
    out += "# HELP kiln_sse_clients Live event-stream clients.\n# TYPE kiln_sse_clients gauge\n";
    out += "kiln_sse_clients " + std::to_string(app.hub->subscriber_count()) + "\n";
    out += "# HELP kiln_sse_dropped_total Event-stream clients dropped for being too slow.\n";
    out += "# TYPE kiln_sse_dropped_total counter\n";
    out += "kiln_sse_dropped_total " + std::to_string(app.hub->dropped_count()) + "\n";
  }
  if (app.models != nullptr) {
    // KV memory of each loaded model: a pool that is always full, or preemptions that keep
    // rising, mean builds recompute their history: raise kv_budget or lower max_sessions.
    const std::map<std::string, json> kv = app.models->kv_stats();
    const std::tuple<const char*, const char*, const char*, const char*> families[] = {
        {"kiln_kv_pages", "pages", "gauge", "KV cache pages the model's pool may hold."},
        {"kiln_kv_pages_in_use", "pages_in_use", "gauge", "KV cache pages held by sessions."},
        {"kiln_kv_reclaims_total", "reclaims", "counter", "Idle sessions whose KV pages were taken for another."},
        {"kiln_kv_preemptions_total", "preemptions", "counter",
         "Sessions inside a call whose KV pages were taken for a higher-ranked one (their history is recomputed)."},
        {"kiln_kv_waits_total", "waits", "counter", "Calls of running sessions held back until KV pages came free."},
        {"kiln_kv_refusals_total", "refusals", "counter",
         "New sessions' first prompts refused for KV memory (their builds wait and try again)."}};
    for (const auto& [family, key, type, help] : families) {
      out += std::string("# HELP ") + family + " " + help + "\n# TYPE " + family + " " + type + "\n";
      for (const auto& [model, stats] : kv)
        out += std::string(family) + "{model=\"" + prometheus_label(model) + "\"} " + stats.value(key, json(0)).dump() + "\n";
    }
  }
  app.http_metrics->render(out);
  return res;
}

}  // namespace kiln::server
