#include "server/http_types.h"

#include <nlohmann/json.hpp>

namespace kiln::server {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in`; '+' means space only in query strings. False on a malformed escape.
bool percent_decode(std::string_view in, bool plus_is_space, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = hex_value(in[i + 1]);
      int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return true;
}

}  // namespace

const std::string& HttpRequest::header(const std::string& name) const {
  static const std::string empty;
  auto it = headers.find(name);
  return it == headers.end() ? empty : it->second;
}

std::optional<TargetError> parse_target(const std::string& target, std::string& path,
                                        std::map<std::string, std::string>& query) {
  query.clear();
  size_t qpos = target.find('?');
  std::string_view raw_path = std::string_view(target).substr(0, qpos);
  if (raw_path.empty() || raw_path.front() != '/') {
    return TargetError{"request target must start with '/'", "path"};
  }
  if (!percent_decode(raw_path, false, path)) return TargetError{"bad percent-encoding in path", "path"};
  if (qpos == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(target).substr(qpos + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string key, value;
    if (!percent_decode(pair.substr(0, eq), true, key)) {
      return TargetError{"bad percent-encoding in a query parameter name", "query"};
    }
    if (eq != std::string_view::npos && !percent_decode(pair.substr(eq + 1), true, value)) {
      return TargetError{"bad percent-encoding in query parameter '" + key + "'", key};
    }
    query[key] = value;
  }
  return std::nullopt;
}

HttpRequest make_request(std::string method, std::string target, std::string body,
                         std::map<std::string, std::string> headers) {
  HttpRequest req;
  req.method = std::move(method);
  req.target = std::move(target);
  req.body = std::move(body);
  for (auto& [name, value] : headers) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[lower] = value;
  }
  req.target_error = parse_target(req.target, req.path, req.query);
  return req;
}

HttpResponse error_response(int status, const std::string& code, const std::string& message,
                            const std::string& field) {
  nlohmann::json err = {{"code", code}, {"message", message}};
  err["field"] = field.empty() ? nlohmann::json(nullptr) : nlohmann::json(field);
  return json_response(status, {{"error", err}});
}

HttpResponse json_response(int status, const nlohmann::json& body) {
  HttpResponse res;
  res.status = status;
  res.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  res.body.push_back('\n');
  return res;
}

}  // namespace kiln::server
