// Plain HTTP request/response values, free of Beast, so route functions are ordinary
// request -> response functions that tests call without sockets (Beast's handle_request habit).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kiln::server {

// Why a request target did not parse, and the field at fault: "path", "query" (a bad key) or the
// query parameter whose value is malformed.
struct TargetError {
  std::string message;
  std::string field;
};

struct HttpRequest {
  std::string method;                         // "GET", "POST", ...
  std::string target;                         // raw request target, e.g. "/v1/builds?limit=5"
  std::string path;                           // percent-decoded path, no query
  std::map<std::string, std::string> query;   // percent-decoded query parameters (last wins)
  std::map<std::string, std::string> headers; // lower-case names
  std::string body;
  std::optional<TargetError> target_error;    // set when the target is malformed; the router answers 400

  // The header value, or "" when absent. `name` must be lower-case.
  const std::string& header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// Splits a request target into a decoded path and query map. Returns the error naming the bad
// part (e.g. "bad percent-encoding in query parameter 'limit'", field "limit") or nullopt.
std::optional<TargetError> parse_target(const std::string& target, std::string& path,
                                        std::map<std::string, std::string>& query);

// Builds a request from its parts (method, target, body, headers), parsing the target into
// path, query and target_error; used by tests (the network session fills its own).
HttpRequest make_request(std::string method, std::string target, std::string body = {},
                         std::map<std::string, std::string> headers = {});

// The API's one error shape: {"error": {"code", "message", "field"}} (field null when none).
HttpResponse error_response(int status, const std::string& code, const std::string& message,
                            const std::string& field = {});
// Invalid UTF-8 in `body` (error messages quote raw input) is replaced with U+FFFD, not thrown.
HttpResponse json_response(int status, const nlohmann::json& body);

}  // namespace kiln::server
