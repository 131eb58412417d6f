// http_bench: how fast the kiln server answers GET /v1/builds/{id}, and how fast it fans a build's
// events out to many SSE watchers. Starts a real server (in process, ephemeral loopback port, a
// SQLite file in a temp dir) and real clients over TCP.
//
//   build/bin/http_bench [--seconds S] [--threads T] [--watchers W] [--events E]
#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/client.h"
#include "server/config.h"
#include "server/event_hub.h"
#include "server/server.h"
#include "store/store.h"

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// T threads, each one keep-alive connection, GET target in a loop for `seconds`.
struct GetResult {
  uint64_t requests = 0;
  double seconds = 0;
  double p50_us = 0, p99_us = 0;
  uint64_t errors = 0;
};

GetResult bench_get(uint16_t port, const std::string& target, int threads, double seconds) {
  std::atomic<uint64_t> errors{0};
  std::vector<std::vector<double>> latencies(threads);
  std::vector<std::thread> pool;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration<double>(seconds);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      asio::io_context ioc;
      asio::ip::tcp::socket sock(ioc);
      beast::error_code ec;
      sock.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
      if (ec) {
        ++errors;
        return;
      }
      beast::flat_buffer buffer;
      http::request<http::empty_body> req(http::verb::get, target, 11);
      req.set(http::field::host, "127.0.0.1");
      while (Clock::now() < deadline) {
        auto r0 = Clock::now();
        http::write(sock, req, ec);
        http::response<http::string_body> res;
        if (!ec) http::read(sock, buffer, res, ec);
        if (ec || res.result_int() != 200) {
          ++errors;
          return;
        }
        latencies[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - r0).count());
      }
    });
  }
  for (auto& th : pool) th.join();
  GetResult r;
  r.seconds = seconds_since(t0);
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  r.requests = all.size();
  r.errors = errors;
  if (!all.empty()) {
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
}

struct FanoutResult {
  double append_seconds = 0;  // writer: time to append all events and finish
  double drain_seconds = 0;   // first append -> last watcher saw `end`
  uint64_t delivered = 0;     // events received over all watchers
  int complete_watchers = 0;  // watchers that saw every event and `end`
};

FanoutResult bench_fanout(kiln::server::Server& server, int watchers, int events) {
  kiln::store::Store& store = server.store();
  kiln::store::BuildSpec spec;
  spec.repo = "/tmp/bench-repo";
  spec.task = "fan-out bench";
  spec.model = "bench-model";
  spec.priority = 100;  // claimed before the GET benchmark's build, which stays queued
  int64_t id = store.submit(spec).value().id;
  kiln::store::ClaimRequest claim;
  claim.owner = "bench";
  auto claimed = store.claim(claim);
  if (!claimed.ok() || !claimed.value() || claimed.value()->id != id) {
    std::fprintf(stderr, "http_bench: could not claim the fan-out build\n");
    std::exit(1);
  }
  int attempt = claimed.value()->attempt;

  kiln::server::ServerUrl url;
  url.port = std::to_string(server.port());
  std::atomic<uint64_t> delivered{0};
  std::atomic<int> complete{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  std::string target = "/v1/builds/" + std::to_string(id) + "/events";
  for (int w = 0; w < watchers; ++w) {
    pool.emplace_back([&] {
      kiln::server::Client client(url, "", 60);
      uint64_t mine = 0;
      bool ended = false;
      ++ready;
      client.stream(target, 0, [&](const kiln::server::SseMessage& m) {
        if (m.event == "end") {
          ended = true;
          return kiln::server::StreamControl::stop;
        }
        ++mine;
        return kiln::server::StreamControl::keep_going;
      });
      delivered += mine;
      if (ended) ++complete;
    });
  }
  while (ready.load() < watchers || server.hub().subscriber_count() < static_cast<size_t>(watchers)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto t0 = Clock::now();
  std::string payload = nlohmann::json{{"text", std::string(200, 'x')}}.dump();
  for (int i = 0; i < events; ++i) {
    auto appended = store.append_event(id, attempt, "model_text", payload);
    if (!appended.ok()) {
      std::fprintf(stderr, "http_bench: append failed: %s\n", appended.error().message.c_str());
      std::exit(1);
    }
  }
  kiln::store::FinishRequest fin;
  fin.status = kiln::store::BuildStatus::succeeded;
  fin.reason = kiln::store::OutcomeReason::no_verify;
  if (!store.finish(id, attempt, fin).ok()) {
    std::fprintf(stderr, "http_bench: finish failed\n");
    std::exit(1);
  }
  FanoutResult r;
  r.append_seconds = seconds_since(t0);
  for (auto& th : pool) th.join();
  r.drain_seconds = seconds_since(t0);
  r.delivered = delivered;
  r.complete_watchers = complete;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  int threads = 8, watchers = 100, events = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seconds") seconds = std::stod(argv[i + 1]);
    else if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--watchers") watchers = std::stoi(argv[i + 1]);
    else if (a == "--events") events = std::stoi(argv[i + 1]);
    else {
      std::cerr << "usage: http_bench [--seconds S] [--threads T] [--watchers W] [--events E]\n";
      return 2;
    }
  }
  auto dir = std::filesystem::temp_directory_path() / ("kiln-http-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  kiln::server::ServerConfig config;
  config.listen.port = 0;
  config.db_path = (dir / "kiln.db").string();
  config.io_threads = 2;
  config.start_workers = false;  // the bench plays the worker
  std::ostringstream log;
  std::string error;
  auto server = kiln::server::Server::start(config, log, error);
  if (!server) {
    std::cerr << "http_bench: " << error << "\n";
    return 1;
  }
  kiln::store::BuildSpec spec;
  spec.repo = "/tmp/bench-repo";
  spec.task = "a build to fetch";
  spec.model = "bench-model";
  int64_t id = server->store().submit(spec).value().id;

  GetResult get = bench_get(server->port(), "/v1/builds/" + std::to_string(id), threads, seconds);
  FanoutResult fan = bench_fanout(*server, watchers, events);
  server->stop();
  std::filesystem::remove_all(dir);

  std::printf("command: ");
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\nmachine: %u hardware threads; server io_threads=%d; clients in the same process\n\n",
              std::thread::hardware_concurrency(), config.io_threads);
  std::printf("| benchmark | setting | result |\n|---|---|---|\n");
  std::printf("| GET /v1/builds/{id} | %d keep-alive clients, %.1f s | %.0f req/s (p50 %.0f us, p99 %.0f us, %llu errors) |\n",
              threads, get.seconds, get.requests / get.seconds, get.p50_us, get.p99_us,
              static_cast<unsigned long long>(get.errors));
  std::printf("| SSE fan-out | %d watchers x %d events | %.0f events/s delivered; appends took %.2f s, last watcher done at %.2f s; %d/%d watchers complete |\n",
              watchers, events, fan.delivered / fan.drain_seconds, fan.append_seconds, fan.drain_seconds,
              fan.complete_watchers, watchers);
  return 0;
}
