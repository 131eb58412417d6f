// Private to server/: the Beast side. One Listener accepts; one HttpSession per connection owns
// its socket and buffers; a request for an event stream hands the socket over to an SseSession.
// This header pulls in Beast and must not be included outside server/*.cpp.
//
// HttpSession states (each transition named by its method):
//   do_read --(request parsed)--> on_read --handle_request--> do_write --> on_write --> do_read
//   on_read --(SSE request)--> hand over to SseSession (this session ends)
//   any --(error, close, shutdown())--> do_close
// SseSession states:
//   start (head queued, subscribed to the hub) --send--> writing --close(flush)--> do_close
//   a read that completes (client gone) or a write error -> closed (the hub drops it)
#pragma once

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <map>

#include "server/event_hub.h"
#include "server/routes.h"

namespace kiln::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class HttpSession;
class SseSession;

// Shared by every session; owned by the Server. The registry lets shutdown reach every
// live connection: guarded by mu.
struct SessionContext {
  App* app = nullptr;
  std::mutex mu;
  std::map<uint64_t, std::weak_ptr<HttpSession>> sessions;  // guarded by mu
  uint64_t next_session_id = 0;                             // guarded by mu
  std::atomic<bool> stopping{false};
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, SessionContext& ctx);
  ~HttpSession();
  void run();
  // From any thread: stop reading; a response being written finishes first.
  void shutdown();

 private:
  void do_read();
  void on_read(beast::error_code ec, std::size_t bytes);
  void do_write(HttpResponse response, bool keep_alive, std::string route, bool head = false);
  void on_write(bool keep_alive, beast::error_code ec, std::size_t bytes);
  void do_close();

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<http::response<http::string_body>> response_;  // the one in flight
  SessionContext& ctx_;
  uint64_t id_ = 0;
  bool reading_ = false;  // on the strand only
};

class SseSession : public SseSink, public std::enable_shared_from_this<SseSession> {
 public:
  SseSession(beast::tcp_stream&& stream, beast::flat_buffer&& leftover, SessionContext& ctx);
  ~SseSession() override;
  // Writes the response head and subscribes to the hub.
  void start(EventHub& hub, const StreamStart& what);

  // SseSink (called from the hub thread; each posts onto this session's strand).
  bool open() const override { return open_.load(); }
  size_t buffered_bytes() const override { return buffered_.load(); }
  void send(std::string bytes) override;
  void close(bool flush) override;

 private:
  void do_enqueue(std::string bytes);
  void do_write();
  void on_write(beast::error_code ec, std::size_t bytes);
  void do_watch();  // a read that only ends when the client goes away
  void on_watch(beast::error_code ec, std::size_t bytes);
  void do_close();

  beast::tcp_stream stream_;
  beast::flat_buffer read_buffer_;
  SessionContext& ctx_;
  std::deque<std::string> queue_;  // on the strand only
  bool writing_ = false;           // on the strand only
  bool close_after_flush_ = false; // on the strand only
  std::atomic<bool> open_{true};
  std::atomic<size_t> buffered_{0};
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& ioc, SessionContext& ctx);
  // Binds and listens; error names the address.
  std::optional<std::string> listen(const std::string& host, uint16_t port);
  uint16_t port() const { return port_; }
  void run();
  void stop();  // from any thread

 private:
  void do_accept();
  void on_accept(beast::error_code ec, tcp::socket socket);

  asio::io_context& ioc_;
  tcp::acceptor acceptor_;
  SessionContext& ctx_;
  uint16_t port_ = 0;
};

}  // namespace kiln::server
