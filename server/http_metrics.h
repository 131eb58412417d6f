// Counters of HTTP requests by route pattern and status code, rendered in Prometheus text format.
// Thread-safe: every io thread records into it; /metrics renders a snapshot.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace kiln::server {

class HttpMetrics {
 public:
  // `route` is the pattern ("/v1/builds/{id}"), never the raw path, so labels stay bounded.
  void record(const std::string& route, int status);
  uint64_t count(const std::string& route, int status) const;
  // Appends kiln_http_requests_total{route,code} lines (with HELP/TYPE) to `out`.
  void render(std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;  // guarded by mu_
};

// Escapes a Prometheus label value (backslash, quote, newline).
std::string prometheus_label(const std::string& value);

}  // namespace kiln::server
