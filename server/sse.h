// Server-Sent Events: the wire format (frames the server writes) and an incremental parser
// (what the CLI client and tests read). Pure functions; no sockets.
//
// kiln's stream for one build:   id: <seq>\nevent: <kind>\ndata: <event json>\n\n   per event,
//                                : ping\n\n                                         every 15 s idle,
//                                event: end\ndata: {"status":..,"reason":..}\n\n   once terminal.
// `end` carries no id, so a client's Last-Event-ID stays the seq of the last real event.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::server {

// One frame; `data` may contain newlines (each line becomes its own data: field).
std::string sse_frame(std::optional<int64_t> id, const std::string& event, const std::string& data);
std::string sse_comment(const std::string& text);

// The HTTP response head the server writes before the frames (connection closes at the end).
std::string sse_response_head();

struct SseMessage {
  std::optional<int64_t> id;  // absent when the frame had no (numeric) id field
  std::string event = "message";
  std::string data;
};

// Incremental parser: feed() any split of the byte stream; complete messages come out in order.
// Comments and empty frames are skipped; both "\n" and "\r\n" line ends are accepted.
class SseParser {
 public:
  std::vector<SseMessage> feed(std::string_view bytes);

 private:
  void on_line(std::string_view line, std::vector<SseMessage>& out);
  std::string partial_;     // bytes of an unfinished line
  SseMessage current_;
  bool has_fields_ = false;
  bool has_data_ = false;
};

}  // namespace kiln::server
