// The router: auth, path splitting and dispatch to the route functions. Nothing here blocks
// except what the route functions do (short SQLite reads and writes).
#include "server/routes.h"

#include <charconv>

#include <nlohmann/json.hpp>

#include "server/auth.h"
#include "server/http_types.h"

namespace kiln::server {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool decode_segment(std::string_view raw, std::string& out) {
  out.clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '%') {
      out.push_back(raw[i]);
      continue;
    }
    if (i + 2 >= raw.size()) return false;
    int hi = hex_digit(raw[i + 1]), lo = hex_digit(raw[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

HttpResponse method_not_allowed(const std::string& method, const char* allowed) {
  HttpResponse res = error_response(405, "method_not_allowed",
                                    "method " + method + " is not allowed here; use " + allowed, "method");
  res.headers.emplace_back("Allow", allowed);
  return res;
}

RouteResult make(HttpResponse res, std::string route) { return {std::move(res), std::move(route), std::nullopt}; }

// /v1/builds/... once auth passed.
RouteResult route_builds(const HttpRequest& req, const std::vector<std::string>& seg, App& app) {
  const std::string& m = req.method;
  if (seg.size() == 2) {
    if (m == "POST") return make(submit_build(req, app), "/v1/builds");
    if (m == "GET") return make(list_builds(req, app), "/v1/builds");
    return make(method_not_allowed(m, "GET, POST"), "/v1/builds");
  }
  std::optional<int64_t> id = parse_build_id(seg[2]);
  std::string pattern = "/v1/builds/{id}";
  if (seg.size() == 4) pattern += "/" + seg[3];
  if (seg.size() > 4 || (seg.size() == 4 && seg[3] != "cancel" && seg[3] != "diff" && seg[3] != "events")) {
    return make(error_response(404, "not_found", "no route for " + req.path, "path"), "unmatched");
  }
  if (!id) {
    return make(error_response(400, "invalid_id", "build id must be a positive integer, got '" + seg[2] + "'", "id"),
                pattern);
  }
  if (seg.size() == 3) {
    if (m != "GET") return make(method_not_allowed(m, "GET"), pattern);
    return make(get_build(*id, app), pattern);
  }
  if (seg[3] == "cancel") {
    if (m != "POST") return make(method_not_allowed(m, "POST"), pattern);
    return make(cancel_build(*id, app), pattern);
  }
  if (m != "GET") return make(method_not_allowed(m, "GET"), pattern);
  if (seg[3] == "diff") return make(get_diff(*id, app), pattern);
  RouteResult r = get_events(*id, req, app);
  r.route = pattern;
  return r;
}

}  // namespace

std::optional<std::string> split_path(const std::string& target, std::vector<std::string>& segments) {
  segments.clear();
  std::string_view raw = std::string_view(target).substr(0, target.find('?'));
  if (raw.empty() || raw.front() != '/') return "request target must start with '/'";
  raw.remove_prefix(1);
  while (!raw.empty()) {
    size_t slash = raw.find('/');
    std::string_view part = raw.substr(0, slash);
    raw = slash == std::string_view::npos ? std::string_view() : raw.substr(slash + 1);
    std::string decoded;
    if (!decode_segment(part, decoded)) return "bad percent-encoding in path";
    if (decoded == "." || decoded == ".." || part == "." || part == "..") {
      return "dot segments ('.' or '..') are not allowed in paths";
    }
    if (!decoded.empty()) segments.push_back(std::move(decoded));
  }
  return std::nullopt;
}

std::optional<int64_t> parse_build_id(const std::string& segment) {
  if (segment.empty() || segment.size() > 18 || segment.front() == '0') return std::nullopt;
  int64_t id = 0;
  auto [ptr, ec] = std::from_chars(segment.data(), segment.data() + segment.size(), id);
  if (ec != std::errc() || ptr != segment.data() + segment.size() || id <= 0) return std::nullopt;
  return id;
}

RouteResult handle_request(const HttpRequest& req, App& app) {
  // HEAD is GET without the body (RFC 9110 9.3.2; the session drops the body): routed as GET,
  // never as an event stream (no Accept), so it gets the headers of the JSON answer.
  if (req.method == "HEAD") {
    HttpRequest as_get = req;
    as_get.method = "GET";
    as_get.headers.erase("accept");
    return handle_request(as_get, app);  // a route without GET answers 405 with its Allow
  }
  std::vector<std::string> seg;
  if (auto err = split_path(req.target, seg)) {
    return make(error_response(400, "invalid_path", *err, "path"), "invalid");
  }
  if (const auto& err = req.target_error) {  // a malformed query: ignoring it would drop a filter
    std::string code = err->field == "path" ? "invalid_path" : "invalid_parameter";
    return make(error_response(400, code, err->message, err->field), "invalid");
  }
  // Public: liveness and the static page (it holds no data; it asks the user for the token).
  if (seg.size() == 1 && seg[0] == "healthz") {
    if (req.method != "GET" && req.method != "HEAD") return make(method_not_allowed(req.method, "GET"), "/healthz");
    return make(json_response(200, {{"status", "ok"}}), "/healthz");
  }
  if (seg.empty() || (seg.size() == 1 && seg[0] == "index.html")) {
    if (req.method != "GET" && req.method != "HEAD") return make(method_not_allowed(req.method, "GET"), "/");
    HttpResponse res;
    res.content_type = "text/html; charset=utf-8";
    res.body = web_index_html();
    res.headers.emplace_back("Cache-Control", "no-cache");
    return make(std::move(res), "/");
  }
  if (!bearer_allows(app.config->token, req.header("authorization"))) {
    HttpResponse res = error_response(401, "unauthorized", "missing or wrong 'Authorization: Bearer <token>'",
                                      "authorization");
    res.headers.emplace_back("WWW-Authenticate", "Bearer");
    return make(std::move(res), "unauthorized");
  }
  if (seg.size() == 1 && seg[0] == "metrics") {
    if (req.method != "GET") return make(method_not_allowed(req.method, "GET"), "/metrics");
    return make(render_metrics(app), "/metrics");
  }
  if (seg.size() >= 2 && seg[0] == "v1" && seg[1] == "builds") return route_builds(req, seg, app);
  if (seg.size() == 2 && seg[0] == "v1" && seg[1] == "models") {
    if (req.method != "GET") return make(method_not_allowed(req.method, "GET"), "/v1/models");
    return make(list_models(app), "/v1/models");
  }
  if (seg.size() == 2 && seg[0] == "v1" && seg[1] == "compare") {
    if (req.method != "GET") return make(method_not_allowed(req.method, "GET"), "/v1/compare");
    return make(compare_models(req, app), "/v1/compare");
  }
  return make(error_response(404, "not_found", "no route for " + req.method + " " + req.path, "path"), "unmatched");
}

}  // namespace kiln::server
