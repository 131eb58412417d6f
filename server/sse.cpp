#include "server/sse.h"

#include <charconv>

namespace kiln::server {

std::string sse_frame(std::optional<int64_t> id, const std::string& event, const std::string& data) {
  std::string out;
  out.reserve(data.size() + 48);
  if (id) out += "id: " + std::to_string(*id) + "\n";
  out += "event: " + event + "\n";
  size_t start = 0;
  for (;;) {
    size_t nl = data.find('\n', start);
    out += "data: ";
    out.append(data, start, nl == std::string::npos ? std::string::npos : nl - start);
    out += "\n";
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  out += "\n";
  return out;
}

std::string sse_comment(const std::string& text) { return ": " + text + "\n\n"; }

std::string sse_response_head() {
  return "HTTP/1.1 200 OK\r\n"
         "Content-Type: text/event-stream\r\n"
         "Cache-Control: no-cache\r\n"
         "X-Accel-Buffering: no\r\n"
         "Connection: close\r\n"
         "\r\n";
}

std::vector<SseMessage> SseParser::feed(std::string_view bytes) {
  std::vector<SseMessage> out;
  partial_.append(bytes.data(), bytes.size());
  size_t start = 0;
  for (;;) {
    size_t nl = partial_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(partial_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    on_line(line, out);
    start = nl + 1;
  }
  partial_.erase(0, start);
  return out;
}

void SseParser::on_line(std::string_view line, std::vector<SseMessage>& out) {
  if (line.empty()) {  // dispatch
    if (has_fields_) out.push_back(std::move(current_));
    current_ = SseMessage{};
    has_fields_ = has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment (ping)
  size_t colon = line.find(':');
  std::string_view name = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (name == "data") {
    if (has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    has_fields_ = has_data_ = true;
  } else if (name == "event") {
    current_.event = std::string(value);
    has_fields_ = true;
  } else if (name == "id") {
    int64_t id = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), id);
    if (ec == std::errc() && ptr == value.data() + value.size()) current_.id = id;
    has_fields_ = true;
  }
}

}  // namespace kiln::server
