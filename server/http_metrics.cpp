#include "server/http_metrics.h"

namespace kiln::server {

void HttpMetrics::record(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++counts_[{route, status}];
}

uint64_t HttpMetrics::count(const std::string& route, int status) const {
  std::lock_guard lock(mu_);
  auto it = counts_.find({route, status});
  return it == counts_.end() ? 0 : it->second;
}

void HttpMetrics::render(std::string& out) const {
  std::map<std::pair<std::string, int>, uint64_t> snapshot;
  {
    std::lock_guard lock(mu_);
    snapshot = counts_;
  }
  out += "# HELP kiln_http_requests_total HTTP requests served, by route pattern and status code.\n";
  out += "# TYPE kiln_http_requests_total counter\n";
  for (const auto& [key, n] : snapshot) {
    out += "kiln_http_requests_total{route=\"" + prometheus_label(key.first) + "\",code=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
}

std::string prometheus_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace kiln::server
