#include "server/health_server.h"

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <charconv>
#include <iostream>
#include <thread>

namespace kiln::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

bool parse_listen_address(const std::string& text, ListenAddress& out, std::string& error) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      error = "expected [ipv6]:port, got '" + text + "'";
      return false;
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      error = "expected host:port, got '" + text + "'";
      return false;
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port > 65535) {
    error = "bad port '" + port_text + "'";
    return false;
  }
  if (host.empty()) host = "127.0.0.1";
  out.host = host;
  out.port = static_cast<uint16_t>(port);
  return true;
}

namespace {

void handle_connection(tcp::socket socket) {
  beast::error_code ec;
  beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> req;
    http::read(socket, buffer, req, ec);
    if (ec) return;
    http::response<http::string_body> res;
    res.version(req.version());
    res.keep_alive(req.keep_alive());
    res.set(http::field::content_type, "application/json");
    if (req.method() == http::verb::get && req.target() == "/healthz") {
      res.result(http::status::ok);
      res.body() = R"({"status":"ok"})";
    } else {
      res.result(http::status::not_found);
      res.body() = R"({"error":{"code":"not_found","message":"no such route","field":null}})";
    }
    res.prepare_payload();
    http::write(socket, res, ec);
    if (ec || !res.keep_alive()) return;
  }
}

}  // namespace

int serve_health_only(const ListenAddress& address, std::ostream& log) {
  asio::io_context io;
  beast::error_code ec;
  auto ip = asio::ip::make_address(address.host, ec);
  if (ec) {
    log << "kiln serve: bad listen host '" << address.host << "': " << ec.message() << "\n";
    return 1;
  }
  tcp::acceptor acceptor(io);
  tcp::endpoint endpoint(ip, address.port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    log << "kiln serve: cannot listen on " << address.host << ":" << address.port << ": " << ec.message()
        << "\n";
    return 1;
  }
  log << "kiln serve: listening on http://" << address.host << ":" << acceptor.local_endpoint().port()
      << std::endl;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const beast::error_code&, int) { acceptor.close(); io.stop(); });
  std::function<void()> do_accept = [&] {
    acceptor.async_accept([&](beast::error_code accept_ec, tcp::socket socket) {
      if (accept_ec) return;
      std::thread(handle_connection, std::move(socket)).detach();
      do_accept();
    });
  };
  do_accept();
  io.run();
  log << "kiln serve: stopped" << std::endl;
  return 0;
}

}  // namespace kiln::server
