// The HTTP client behind `kiln submit|logs|builds|cancel|compare`: one synchronous request per
// connection (Beast underneath, hidden here), and an SSE reader that resumes with Last-Event-ID.
// Every operation has a deadline; errors name the server address and what failed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "server/sse.h"

namespace kiln::server {

struct ServerUrl {
  std::string host = "127.0.0.1";
  std::string port = "8080";
  std::string text() const { return "http://" + host + ":" + port; }
};

// Accepts "http://host:port", "http://host" (port 80), "host:port"; https is refused by name.
std::optional<std::string> parse_server_url(const std::string& url, ServerUrl& out);

struct ClientResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

// What stream() should do after a message: keep reading or stop.
enum class StreamControl { keep_going, stop };

class Client {
 public:
  Client(ServerUrl url, std::string token, int timeout_seconds = 30);

  // One request on a fresh connection; nullopt on success (any HTTP status), else the error.
  std::optional<std::string> request(const std::string& method, const std::string& target, const std::string& body,
                                     ClientResponse& out) const;

  // Reads the SSE stream at `target`, sending Last-Event-ID when last_event_id > 0. Calls
  // `on_message` per message until the server closes the stream (returns nullopt), on_message says
  // stop (nullopt), or a failure (its description; a non-200 reply gives the JSON error's message).
  // `idle_seconds`: how long without a byte (pings arrive every 15 s) counts as a dead connection.
  std::optional<std::string> stream(const std::string& target, int64_t last_event_id,
                                    const std::function<StreamControl(const SseMessage&)>& on_message,
                                    int idle_seconds = 45) const;

  const ServerUrl& url() const { return url_; }

 private:
  ServerUrl url_;
  std::string token_;
  int timeout_seconds_;
};

// Percent-encodes a query parameter value (keeps letters, digits, "-._~,:"; '+' becomes %2B).
std::string url_encode(const std::string& value);

// The message of an API error body ({"error":{"message",..}}), or the body itself.
std::string api_error_message(const ClientResponse& response);

// One human-readable line for a build event (as the API returns it), e.g. "[12] tool_call bash: ls".
std::string format_event_line(const nlohmann::json& event);
// Text for a terminal: control characters other than newline and tab (C0, DEL, C1: the start of
// escape sequences that retitle, clear or rewrite a terminal) shown as \xNN.
std::string terminal_safe(std::string_view text);
// The longest prefix of at most max_bytes that does not split a UTF-8 character.
std::string cut_utf8(const std::string& text, size_t max_bytes);

}  // namespace kiln::server
