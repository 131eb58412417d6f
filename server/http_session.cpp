#include "server/http_session.h"

#include <iostream>

#include "server/http_metrics.h"
#include "server/sse.h"

namespace kiln::server {

namespace {

constexpr auto kReadTimeout = std::chrono::seconds(60);  // idle keep-alive connections close
constexpr size_t kHeaderLimit = 16 * 1024;

bool is_http_parse_error(const beast::error_code& ec) {
  return ec.category() == make_error_code(http::error::bad_method).category();
}

HttpRequest to_plain(http::request<http::string_body>&& req) {
  HttpRequest out;
  out.method = std::string(req.method_string());
  out.target = std::string(req.target());
  for (const auto& field : req) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.headers[name] = std::string(field.value());
  }
  out.body = std::move(req.body());
  out.target_error = parse_target(out.target, out.path, out.query);
  if (out.target_error) out.path = out.target;  // the router reports it
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// HttpSession

HttpSession::HttpSession(tcp::socket&& socket, SessionContext& ctx) : stream_(std::move(socket)), ctx_(ctx) {}

HttpSession::~HttpSession() {
  std::lock_guard lock(ctx_.mu);
  ctx_.sessions.erase(id_);
}

void HttpSession::run() {
  {
    std::lock_guard lock(ctx_.mu);
    id_ = ++ctx_.next_session_id;
    ctx_.sessions[id_] = weak_from_this();
  }
  asio::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
}

void HttpSession::shutdown() {
  asio::post(stream_.get_executor(), [self = shared_from_this()] {
    if (self->reading_) self->stream_.cancel();  // on_read sees operation_aborted and closes
  });
}

void HttpSession::do_read() {
  if (ctx_.stopping.load()) return do_close();
  parser_.emplace();
  parser_->body_limit(ctx_.app->config->max_body_bytes);
  parser_->header_limit(kHeaderLimit);
  stream_.expires_after(kReadTimeout);
  reading_ = true;
  http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
  reading_ = false;
  if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted || ec == beast::error::timeout) {
    return do_close();
  }
  if (ec == http::error::body_limit) {
    ctx_.app->http_metrics->record("oversized", 413);
    return do_write(error_response(413, "payload_too_large",
                                   "request body exceeds " + std::to_string(ctx_.app->config->max_body_bytes) +
                                       " bytes",
                                   "body"),
                    false, "oversized");
  }
  if (ec == http::error::header_limit) {
    ctx_.app->http_metrics->record("oversized", 431);
    return do_write(error_response(431, "headers_too_large", "request headers exceed 16 KiB", "headers"), false,
                    "oversized");
  }
  if (ec && is_http_parse_error(ec)) {
    ctx_.app->http_metrics->record("invalid", 400);
    return do_write(error_response(400, "bad_request", "malformed HTTP request: " + ec.message(), "request"), false,
                    "invalid");
  }
  if (ec) return do_close();

  bool keep_alive = parser_->get().keep_alive();
  bool head = parser_->get().method() == http::verb::head;
  HttpRequest req = to_plain(parser_->release());
  RouteResult result;
  try {
    result = handle_request(req, *ctx_.app);
  } catch (const std::exception& e) {  // a bug, not the client's fault: say so and keep serving
    std::cerr << "level=error msg=\"route threw\" target=\"" << req.target << "\" what=\"" << e.what() << "\"\n";
    result = {error_response(500, "internal", std::string("internal error: ") + e.what()), "error", std::nullopt};
  }
  if (result.stream && ctx_.app->hub != nullptr && !ctx_.stopping.load()) {
    ctx_.app->http_metrics->record(result.route, 200);
    stream_.expires_never();
    auto sse = std::make_shared<SseSession>(std::move(stream_), std::move(buffer_), ctx_);
    sse->start(*ctx_.app->hub, *result.stream);
    return;  // the connection now belongs to the SseSession
  }
  if (result.stream) result.response = error_response(503, "unavailable", "the server is shutting down");
  ctx_.app->http_metrics->record(result.route, result.response.status);
  do_write(std::move(result.response), keep_alive && !ctx_.stopping.load(), result.route, head);
}

void HttpSession::do_write(HttpResponse response, bool keep_alive, std::string, bool head) {
  response_ = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(response.status), 11);
  response_->set(http::field::server, "kiln");
  response_->set(http::field::content_type, response.content_type);
  for (auto& [name, value] : response.headers) response_->set(name, value);
  response_->keep_alive(keep_alive);
  response_->body() = std::move(response.body);
  response_->prepare_payload();
  // HEAD: the GET response's headers, Content-Length included, and no body (RFC 9110 9.3.2).
  if (head) response_->body().clear();
  http::async_write(stream_, *response_,
                    beast::bind_front_handler(&HttpSession::on_write, shared_from_this(), keep_alive));
}

void HttpSession::on_write(bool keep_alive, beast::error_code ec, std::size_t) {
  response_.reset();
  if (ec) return do_close();
  if (!keep_alive) return do_close();
  do_read();
}

void HttpSession::do_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.socket().close(ec);
}

// ---------------------------------------------------------------------------------------------
// SseSession

SseSession::SseSession(beast::tcp_stream&& stream, beast::flat_buffer&& leftover, SessionContext& ctx)
    : stream_(std::move(stream)), read_buffer_(std::move(leftover)), ctx_(ctx) {}

SseSession::~SseSession() = default;

void SseSession::start(EventHub& hub, const StreamStart& what) {
  // Runs on the strand (called from HttpSession::on_read).
  std::string head = sse_response_head();
  buffered_ += head.size();  // every queued byte is counted, so on_write can subtract it
  do_enqueue(std::move(head));
  do_watch();
  hub.subscribe(std::to_string(what.build_id), what.after_seq, shared_from_this());
}

void SseSession::send(std::string bytes) {
  buffered_ += bytes.size();
  asio::post(stream_.get_executor(),
             [self = shared_from_this(), b = std::move(bytes)]() mutable { self->do_enqueue(std::move(b)); });
}

void SseSession::close(bool flush) {
  asio::post(stream_.get_executor(), [self = shared_from_this(), flush] {
    if (!flush) return self->do_close();
    self->close_after_flush_ = true;
    if (!self->writing_ && self->queue_.empty()) self->do_close();
  });
}

void SseSession::do_enqueue(std::string bytes) {
  if (!open_.load()) {
    buffered_ -= std::min(buffered_.load(), bytes.size());
    return;
  }
  queue_.push_back(std::move(bytes));
  if (!writing_) do_write();
}

void SseSession::do_write() {
  writing_ = true;
  asio::async_write(stream_, asio::buffer(queue_.front()),
                    beast::bind_front_handler(&SseSession::on_write, shared_from_this()));
}

void SseSession::on_write(beast::error_code ec, std::size_t) {
  writing_ = false;
  if (!open_.load()) {
    queue_.clear();
    return;
  }
  size_t n = queue_.front().size();
  size_t half = ctx_.app->config->sse_buffer_bytes / 2;
  bool was_above_half = buffered_.load() > half;
  buffered_ -= std::min(buffered_.load(), n);
  // The hub pauses a client above half its buffer: wake it as soon as this one drained below,
  // so a replay runs at the client's pace rather than one buffer per poll interval.
  if (was_above_half && buffered_.load() <= half) ctx_.app->hub->notify();
  queue_.pop_front();
  if (ec) return do_close();
  if (!queue_.empty()) return do_write();
  if (close_after_flush_) do_close();
}

void SseSession::do_watch() {
  read_buffer_.consume(read_buffer_.size());
  stream_.async_read_some(read_buffer_.prepare(512),
                          beast::bind_front_handler(&SseSession::on_watch, shared_from_this()));
}

void SseSession::on_watch(beast::error_code ec, std::size_t) {
  if (ec) return do_close();  // the client went away (or we closed)
  do_watch();                 // a client has nothing to say on an event stream; ignore it
}

void SseSession::do_close() {
  if (!open_.exchange(false)) return;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
  if (!writing_) queue_.clear();
  buffered_ = 0;
}

// ---------------------------------------------------------------------------------------------
// Listener

Listener::Listener(asio::io_context& ioc, SessionContext& ctx)
    : ioc_(ioc), acceptor_(asio::make_strand(ioc)), ctx_(ctx) {}

std::optional<std::string> Listener::listen(const std::string& host, uint16_t port) {
  beast::error_code ec;
  std::string where = host + ":" + std::to_string(port);
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return "bad listen host '" + host + "': " + ec.message();
  tcp::endpoint endpoint(address, port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return "cannot listen on " + where + ": " + ec.message();
  port_ = acceptor_.local_endpoint().port();
  return std::nullopt;
}

void Listener::run() { do_accept(); }

void Listener::stop() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    beast::error_code ec;
    self->acceptor_.close(ec);
  });
}

void Listener::do_accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), beast::bind_front_handler(&Listener::on_accept, shared_from_this()));
}

void Listener::on_accept(beast::error_code ec, tcp::socket socket) {
  if (!acceptor_.is_open() || ec == asio::error::operation_aborted) return;
  if (ec) {
    // EMFILE and friends: say so and keep accepting; the kernel queue holds the rest.
    std::cerr << "level=warn msg=\"accept failed\" error=\"" << ec.message() << "\"\n";
  } else {
    std::make_shared<HttpSession>(std::move(socket), ctx_)->run();
  }
  do_accept();
}

}  // namespace kiln::server
