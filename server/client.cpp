// Synchronous calls over Beast's async operations on a private io_context, so every step has a
// deadline (tcp_stream timeouts apply only to async operations).
#include "server/client.h"

#include <cctype>

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <nlohmann/json.hpp>

namespace kiln::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

std::optional<std::string> parse_server_url(const std::string& url, ServerUrl& out) {
  std::string rest = url;
  if (rest.rfind("https://", 0) == 0) return "https is not supported; use http:// (put TLS in a proxy)";
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos) return "expected http://host:port, got '" + url + "'";
  out.port = "80";
  if (rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos) return "bad IPv6 address in '" + url + "'";
    out.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') out.port = rest.substr(close + 2);
  } else if (size_t colon = rest.rfind(':'); colon != std::string::npos) {
    out.host = rest.substr(0, colon);
    out.port = rest.substr(colon + 1);
  } else {
    out.host = rest;
  }
  if (out.port.empty() || out.port.find_first_not_of("0123456789") != std::string::npos) {
    return "bad port in '" + url + "'";
  }
  return std::nullopt;
}

Client::Client(ServerUrl url, std::string token, int timeout_seconds)
    : url_(std::move(url)), token_(std::move(token)), timeout_seconds_(timeout_seconds) {}

namespace {

// Runs the io_context until the started operation completes; returns its error.
beast::error_code finish(asio::io_context& ioc, const beast::error_code& ec) {
  ioc.restart();
  ioc.run();
  return ec;
}

std::optional<std::string> connect(asio::io_context& ioc, beast::tcp_stream& stream, const ServerUrl& url,
                                   int timeout_seconds) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(url.host, url.port, ec);
  if (ec) return "cannot resolve " + url.text() + ": " + ec.message();
  stream.expires_after(std::chrono::seconds(timeout_seconds));
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
  if (finish(ioc, ec)) return "cannot connect to " + url.text() + ": " + ec.message();
  return std::nullopt;
}

http::request<http::string_body> make_req(const std::string& method, const std::string& target,
                                          const ServerUrl& url, const std::string& token) {
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, url.host + ":" + url.port);
  req.set(http::field::user_agent, "kiln-cli");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  return req;
}

}  // namespace

std::optional<std::string> Client::request(const std::string& method, const std::string& target,
                                           const std::string& body, ClientResponse& out) const {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (auto err = connect(ioc, stream, url_, timeout_seconds_)) return err;
  auto req = make_req(method, target, url_, token_);
  req.keep_alive(false);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(timeout_seconds_));
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  if (finish(ioc, ec)) return "sending " + method + " " + target + " to " + url_.text() + ": " + ec.message();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256ull << 20);
  http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
  if (finish(ioc, ec)) return "reading the reply to " + method + " " + target + " from " + url_.text() + ": " + ec.message();
  auto res = parser.release();
  out.status = res.result_int();
  out.content_type = std::string(res[http::field::content_type]);
  out.body = std::move(res.body());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return std::nullopt;
}

std::optional<std::string> Client::stream(const std::string& target, int64_t last_event_id,
                                          const std::function<StreamControl(const SseMessage&)>& on_message,
                                          int idle_seconds) const {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  if (auto err = connect(ioc, stream, url_, timeout_seconds_)) return err;
  auto req = make_req("GET", target, url_, token_);
  req.set(http::field::accept, "text/event-stream");
  if (last_event_id > 0) req.set("Last-Event-ID", std::to_string(last_event_id));
  req.prepare_payload();
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(timeout_seconds_));
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  if (finish(ioc, ec)) return "sending GET " + target + " to " + url_.text() + ": " + ec.message();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
  if (finish(ioc, ec)) return "reading the stream head from " + url_.text() + ": " + ec.message();
  if (parser.get().result_int() != 200) {
    http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    finish(ioc, ec);
    ClientResponse r{static_cast<int>(parser.get().result_int()), "", parser.get().body()};
    return "HTTP " + std::to_string(r.status) + ": " + api_error_message(r);
  }
  // The body is the raw event stream until the server closes the connection.
  SseParser sse;
  auto deliver = [&](std::string_view bytes) {
    for (const SseMessage& m : sse.feed(bytes)) {
      if (on_message(m) == StreamControl::stop) return false;
    }
    return true;
  };
  std::string leftover = beast::buffers_to_string(buffer.data());
  buffer.consume(buffer.size());
  if (!deliver(leftover)) return std::nullopt;
  char chunk[16384];
  for (;;) {
    size_t n = 0;
    stream.expires_after(std::chrono::seconds(idle_seconds));
    stream.async_read_some(asio::buffer(chunk), [&](beast::error_code e, size_t got) {
      ec = e;
      n = got;
    });
    finish(ioc, ec);
    if (n > 0 && !deliver(std::string_view(chunk, n))) return std::nullopt;
    if (ec == asio::error::eof) return std::nullopt;
    if (ec) return "event stream from " + url_.text() + " broke: " + ec.message();
  }
}

std::string api_error_message(const ClientResponse& response) {
  auto j = nlohmann::json::parse(response.body, nullptr, false);
  if (!j.is_discarded() && j.contains("error") && j["error"].is_object()) {
    std::string msg = j["error"].value("message", "");
    if (j["error"].contains("field") && j["error"]["field"].is_string()) {
      msg += " (field: " + j["error"]["field"].get<std::string>() + ")";
    }
    return msg;
  }
  return response.body;
}

std::string terminal_safe(std::string_view text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\t') {
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      escape(c);
    } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      escape(static_cast<unsigned char>(text[++i]));  // C1 controls (U+0080-U+009F), e.g. CSI
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string cut_utf8(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;  // not inside a character
  return text.substr(0, end);
}

std::string format_event_line(const nlohmann::json& event) {
  using nlohmann::json;
  std::string kind = event.value("kind", "?");
  std::string line = "[" + std::to_string(event.value("seq", int64_t{0})) + "] " + kind;
  const json& p = event.contains("payload") ? event["payload"] : json();
  auto text_of = [&](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) {
      for (const char* key : {"text", "message", "status", "output", "content"}) {
        if (v.contains(key) && v[key].is_string()) return v[key].get<std::string>();
      }
    }
    return v.is_null() ? std::string() : v.dump();
  };
  if (kind == "tool_call" && p.is_object()) {
    line += " " + p.value("name", p.value("tool", std::string("?")));
    if (p.contains("arguments")) line += " " + (p["arguments"].is_string() ? p["arguments"].get<std::string>() : p["arguments"].dump());
  } else if (kind == "status" && p.is_object() && (p.contains("status") || p.contains("phase"))) {
    line += " " + (p.contains("status") ? p.value("status", std::string("?")) : "phase " + p.value("phase", std::string("?")));
    if (p.contains("position") && p["position"].is_number_integer()) {
      line += " (place " + std::to_string(p["position"].get<int64_t>()) + " in line)";
    }
    // The final status event names the outcome and, for a failed build, why.
    for (const char* key : {"outcome", "reason"})
      if (p.contains(key) && p[key].is_string()) {
        line += " (" + p[key].get<std::string>() + ")";
        break;
      }
    if (p.contains("error_message") && p["error_message"].is_string()) line += ": " + p["error_message"].get<std::string>();
  } else {
    std::string text = text_of(p);
    if (!text.empty()) line += " " + text;
  }
  if (line.size() > 2000) line = cut_utf8(line, 2000) + " …";
  // Model output and command output are untrusted: no escape sequences reach the terminal.
  return terminal_safe(line);
}

std::string url_encode(const std::string& value) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ',' || c == ':') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace kiln::server
