// The HTTP API as plain request -> response functions (Beast's handle_request habit): the
// network session parses a request into an HttpRequest, calls handle_request, and writes the
// HttpResponse back. Tests call handle_request directly, without sockets.
//
// Routes (all JSON unless noted; errors are {"error":{"code","message","field"}}):
//   GET  /healthz                        liveness, no auth
//   GET  /metrics                        Prometheus text
//   GET  /, /index.html                  the web page (no auth; it asks for the token itself)
//   POST /v1/builds                      submit -> 201 build
//   GET  /v1/builds                      ?status=&model=&limit=&cursor= -> {builds, next_cursor}
//   GET  /v1/builds/{id}                 one build
//   POST /v1/builds/{id}/cancel          -> {build, immediate}
//   GET  /v1/builds/{id}/diff            text/x-diff
//   GET  /v1/builds/{id}/events          ?after=&limit= -> {events, next_after, terminal};
//                                        with Accept: text/event-stream -> an SSE stream
//   GET  /v1/models                      configured models, loaded or not, plan and live stats
//   GET  /v1/compare                     ?models=a,b&since=T -> the store's comparison report
//                                        (since: RFC 3339 or unix seconds; builds finished since)
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "server/config.h"
#include "server/http_types.h"

#include <nlohmann/json_fwd.hpp>

namespace kiln::store {
class Store;
struct Build;
struct BuildSpec;
}

namespace kiln::server {

class HttpMetrics;
class EventHub;
class ModelRegistry;

struct SourceCheckResult {  // tools::SourceCheck's fields: this header stays free of tools/
  std::string error;        // empty when fine, not checked, or not checked in time
  std::string field;
};

// What the routes can reach. Owned by the Server; every member outlives the io threads.
// All members are thread-safe (route functions run concurrently on the io threads).
struct App {
  const ServerConfig* config = nullptr;
  store::Store* store = nullptr;
  HttpMetrics* http_metrics = nullptr;
  EventHub* hub = nullptr;          // may be null in route tests (then no SSE counts)
  ModelRegistry* models = nullptr;  // may be null: /v1/models lists config only
  // The submit-time check of a local repository and ref (tools::check_local_source when unset),
  // and how long a request waits for it: a check still running then (a hung network mount)
  // goes on detached and the build is accepted, its clone then reports the source.
  std::function<SourceCheckResult(const std::string& repo, const std::string& ref)> source_check;
  std::chrono::milliseconds source_check_wait{3000};
};

// The session turns this into an SSE stream instead of writing `response`.
struct StreamStart {
  int64_t build_id = 0;
  int64_t after_seq = 0;
};

struct RouteResult {
  HttpResponse response;
  std::string route;                  // pattern for metrics, e.g. "/v1/builds/{id}"
  std::optional<StreamStart> stream;  // set for a valid SSE request (response unused)
};

RouteResult handle_request(const HttpRequest& request, App& app);

// ---- Pieces exposed for tests and for build_routes.cpp ----

// Splits the *raw* path (before percent-decoding) into decoded segments. Dot segments ("." or
// "..", raw or encoded) are refused: the error names "path".
std::optional<std::string> split_path(const std::string& target, std::vector<std::string>& segments);

// Parses a build id path segment: a positive decimal integer, nothing else ("id" field error).
std::optional<int64_t> parse_build_id(const std::string& segment);

// The submit body -> a BuildSpec (config supplies the default model and limits); a 400 naming the
// field on malformed JSON, a wrong type, a missing or an unknown field.
std::optional<HttpResponse> parse_submit(const std::string& body, const ServerConfig& config, store::BuildSpec& spec);
// `since` of /v1/compare: RFC 3339 ("2026-01-31T12:00:00Z", "...+02:00", fractions allowed) or
// unix seconds ("1769860800") -> ms since the epoch; nullopt for anything else.
std::optional<int64_t> parse_since(std::string_view text);
// A build as the API shows it (limits as steps/tokens/wall_seconds, no diff text).
nlohmann::json build_json(const store::Build& build);

// Each route function: request -> response (see build_routes.cpp).
HttpResponse submit_build(const HttpRequest& req, App& app);
HttpResponse list_builds(const HttpRequest& req, App& app);
HttpResponse get_build(int64_t id, App& app);
HttpResponse cancel_build(int64_t id, App& app);
HttpResponse get_diff(int64_t id, App& app);
RouteResult get_events(int64_t id, const HttpRequest& req, App& app);
HttpResponse compare_models(const HttpRequest& req, App& app);
HttpResponse list_models(App& app);
HttpResponse render_metrics(App& app);

// The embedded web page (web_assets.cpp, generated from server/web/).
const std::string& web_index_html();

}  // namespace kiln::server
