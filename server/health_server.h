// A minimal HTTP listener answering GET /healthz. Stand-in until the full API lands
// (issue: server/); it keeps Beast out of this header.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::server {

struct ListenAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
};

// Parses "host:port" (IPv6 as "[::1]:8080"). Returns false with `error` set on bad input.
bool parse_listen_address(const std::string& text, ListenAddress& out, std::string& error);

// Serves until the process receives SIGINT/SIGTERM. Returns 0 on clean shutdown, 1 if the
// address could not be bound (message on `err`).
int serve_health_only(const ListenAddress& address, std::ostream& log);

}  // namespace kiln::server
