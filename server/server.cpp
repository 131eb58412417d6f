#include "server/server.h"

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <ostream>
#include <thread>

#include "engine/capacity.h"
#include "server/auth.h"
#include "server/dispatcher.h"
#include "server/event_hub.h"
#include "server/http_metrics.h"
#include "server/http_session.h"
#include "server/model_host.h"
#include "server/models.h"
#include "server/store_feed.h"
#include "store/store.h"

namespace kiln::server {

// Owns every part of a running server. Destruction order matters and is spelled out in stop().
struct Server::Impl {
  ServerConfig config;
  std::ostream& log;
  std::unique_ptr<store::Store> store;
  HttpMetrics http_metrics;
  std::unique_ptr<StoreFeed> feed;
  std::unique_ptr<EventHub> hub;
  std::unique_ptr<ModelRegistry> models;
  std::unique_ptr<Dispatcher> dispatcher;  // null when start_workers is false
  App app;
  SessionContext ctx;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::shared_ptr<Listener> listener;
  std::vector<std::thread> io_threads;
  std::thread recovery;  // requeues builds whose lease expired (a worker or a process died)

  std::mutex mu;
  std::condition_variable cv;
  int running_io_threads = 0;  // guarded by mu
  bool stop_requested = false; // guarded by mu
  bool stopped = false;        // guarded by mu
  bool recovery_stop = false;  // guarded by mu

  Impl(const ServerConfig& c, std::ostream& l) : config(c), log(l) {}

  // One recovery pass; logs what it did. Runs on the starting thread, then on `recovery`.
  void recover_once() {
    auto report = store->recover();
    if (!report) {
      log << "level=warn msg=\"recovery failed\" error=\"" << report.error().message << "\"" << std::endl;
    } else if (report->requeued + report->errored + report->cancelled > 0) {
      log << "level=warn msg=\"recovered builds whose lease expired\" requeued=" << report->requeued
          << " errored=" << report->errored << " cancelled=" << report->cancelled << std::endl;
    }
  }
  void recovery_loop() {
    auto interval = std::chrono::milliseconds(std::max(1000, config.lease_seconds * 500));
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, interval, [&] { return recovery_stop; })) {
      lock.unlock();
      recover_once();
      lock.lock();
    }
  }
};

std::unique_ptr<Server> Server::start(const ServerConfig& config, std::ostream& log, std::string& error) {
  if (std::string why = check_listen_auth(config.listen.host, config.token); !why.empty()) {
    error = why;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>(config, log);
  resolve_kv_budgets(impl->config, engine::usable_memory_bytes(), log);  // "auto" budgets become bytes
  store::StoreOptions store_options;
  store_options.path = config.db_path;
  store_options.recover_on_open = false;  // recover_once() below, which logs what it did
  if (!config.models.empty()) {
    std::set<std::string> names;
    for (const ModelConfig& m : config.models) names.insert(m.name);
    store_options.allowed_models = std::move(names);
  }
  auto opened = store::Store::open(store_options);
  if (!opened) {
    error = "cannot open database '" + config.db_path + "': " + opened.error().message;
    return nullptr;
  }
  impl->store = std::move(opened.value());
  impl->recover_once();  // builds a dead process left running, once their leases have expired
  impl->feed = std::make_unique<StoreFeed>(*impl->store);
  HubOptions hub_options;
  hub_options.ping_interval = std::chrono::seconds(config.sse_ping_seconds);
  hub_options.stall_timeout = std::chrono::seconds(config.sse_stall_seconds);
  hub_options.buffer_limit_bytes = config.sse_buffer_bytes;
  impl->hub = std::make_unique<EventHub>(*impl->feed, hub_options);
  impl->models = std::make_unique<ModelRegistry>(impl->config.models);
  impl->app.config = &impl->config;
  impl->app.store = impl->store.get();
  impl->app.http_metrics = &impl->http_metrics;
  impl->app.hub = impl->hub.get();
  impl->app.models = impl->models.get();
  impl->ctx.app = &impl->app;

  impl->listener = std::make_shared<Listener>(impl->ioc, impl->ctx);
  if (auto err = impl->listener->listen(config.listen.host, config.listen.port)) {
    error = *err;
    impl->hub->stop();
    return nullptr;
  }
  if (config.start_workers) impl->dispatcher = Dispatcher::start(impl->config, *impl->store, *impl->models, log);
  impl->listener->run();
  impl->work.emplace(impl->ioc.get_executor());
  Impl* raw = impl.get();
  raw->recovery = std::thread([raw] { raw->recovery_loop(); });
  for (int i = 0; i < std::max(1, config.io_threads); ++i) {
    {
      std::lock_guard lock(raw->mu);
      ++raw->running_io_threads;
    }
    raw->io_threads.emplace_back([raw] {
      raw->ioc.run();
      std::lock_guard lock(raw->mu);
      --raw->running_io_threads;
      raw->cv.notify_all();
    });
  }
  log << "level=info msg=\"kiln serve listening\" url=http://" << config.listen.host << ":"
      << impl->listener->port() << " db=" << config.db_path << " io_threads=" << config.io_threads
      << " auth=" << (config.token.empty() ? "none(loopback)" : "bearer") << std::endl;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

uint16_t Server::port() const { return impl_->listener->port(); }
const ServerConfig& Server::config() const { return impl_->config; }
store::Store& Server::store() { return *impl_->store; }
HttpMetrics& Server::http_metrics() { return impl_->http_metrics; }
EventHub& Server::hub() { return *impl_->hub; }

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    s.stop_requested = true;
    s.cv.notify_all();
  }
  // 1. No new connections; new requests on open connections are refused.
  s.ctx.stopping = true;
  s.listener->stop();
  // 2. Event streams end now (clients resume with Last-Event-ID elsewhere or later).
  s.hub->stop();
  // 3. Idle keep-alive connections close; a request being handled finishes and then closes.
  std::vector<std::shared_ptr<HttpSession>> live;
  {
    std::lock_guard lock(s.ctx.mu);
    for (auto& [id, weak] : s.ctx.sessions)
      if (auto session = weak.lock()) live.push_back(std::move(session));
  }
  for (auto& session : live) session->shutdown();
  live.clear();
  // 4. Let the io threads drain, then force.
  s.work.reset();
  {
    std::unique_lock lock(s.mu);
    if (!s.cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.running_io_threads == 0; })) {
      s.log << "level=warn msg=\"connections still open after 5 s; closing them\"" << std::endl;
      s.ioc.stop();
    }
  }
  for (std::thread& t : s.io_threads) t.join();
  s.io_threads.clear();
  // 5. Workers stop; builds they were carrying keep their leases until expiry, and a restarted
  //    server's recovery re-queues them.
  if (s.dispatcher) s.dispatcher->stop();
  {
    std::lock_guard lock(s.mu);
    s.recovery_stop = true;
    s.cv.notify_all();
  }
  if (s.recovery.joinable()) s.recovery.join();
  s.store->stop_waiting();
  s.log << "level=info msg=\"kiln serve stopped\"" << std::endl;
}

void Server::run_until_signal() {
  Impl& s = *impl_;
  asio::signal_set signals(s.ioc, SIGINT, SIGTERM);
  signals.async_wait([&s](const beast::error_code& ec, int signo) {
    if (ec) return;
    s.log << "level=info msg=\"signal received; shutting down\" signal=" << signo << std::endl;
    std::lock_guard lock(s.mu);
    s.stop_requested = true;
    s.cv.notify_all();
  });
  {
    std::unique_lock lock(s.mu);
    s.cv.wait(lock, [&] { return s.stop_requested; });
  }
  beast::error_code ec;
  signals.cancel(ec);
  stop();
}

}  // namespace kiln::server
