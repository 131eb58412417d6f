// The kiln server: HTTP API, SSE fan-out, and (when configured) the workers, in one process.
// Beast-free: other folders and tests include this header.
//
// Lifecycle: start() -> running (io threads serve, hub streams) -> stop() -> stopped.
//   stop(): stop accepting, close event streams, let in-flight requests finish (closing idle
//   keep-alive connections), stop the workers, join every thread (5 s grace, then forced).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "server/config.h"

namespace kiln::store {
class Store;
}

namespace kiln::server {

class HttpMetrics;
class EventHub;

class Server {
 public:
  // Opens the store, binds the listener and starts the threads. On failure returns null and sets
  // `error` naming what failed (the address, the database file, the token rule).
  static std::unique_ptr<Server> start(const ServerConfig& config, std::ostream& log, std::string& error);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;  // the bound port (useful with port 0)
  const ServerConfig& config() const;
  store::Store& store();  // thread-safe; tests use it to drive builds
  HttpMetrics& http_metrics();
  EventHub& hub();

  void stop();  // idempotent; graceful (see above)
  // Blocks until SIGINT/SIGTERM or stop() from another thread; then stops.
  void run_until_signal();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
