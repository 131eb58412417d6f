// The real server on an ephemeral loopback port over a real SQLite file: streams, reconnects,
// concurrency, errors on the wire, slow clients, shutdown. The test plays the worker through the
// store API (claim, append events, finish).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <csignal>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/worker.h"
#include "engine/make_tiny.h"
#include "server/event_hub.h"
#include "server/http_metrics.h"
#include "test_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;
using testing::ServerFixture;
using testing::TempDir;

// A plain blocking socket with a receive timeout, for tests that need raw bytes.
class RawSocket {
 public:
  RawSocket(uint16_t port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawSocket() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send_all(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  // Reads until `needle` appears (true) or EOF/timeout (false).
  bool read_until(const std::string& needle, std::string& got) {
    char buf[4096];
    while (got.find(needle) == std::string::npos) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      got.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // Everything until the peer closes (or the receive timeout).
  std::string read_to_eof() {
    std::string got;
    read_until(std::string(1, '\0'), got);  // never sent: reads to the end
    return got;
  }
  // True when the peer closed the connection (reads drain data until EOF).
  bool closed_by_peer() {
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Plays a worker: claims the build, appends `events` log events, finishes it succeeded.
void run_fake_worker(store::Store& s, int64_t id, int events, std::chrono::milliseconds gap) {
  int attempt = testing::claim_build(s, id);
  ASSERT_GT(attempt, 0);
  for (int i = 0; i < events; ++i) {
    ASSERT_TRUE(s.append_event(id, attempt, "log", json{{"text", "step " + std::to_string(i)}}.dump()).ok());
    std::this_thread::sleep_for(gap);
  }
  store::FinishRequest fin;
  fin.status = store::BuildStatus::succeeded;
  fin.reason = store::OutcomeReason::no_verify;
  ASSERT_TRUE(s.finish(id, attempt, fin).ok());
}

std::vector<int64_t> all_seqs(store::Store& s, int64_t id) {
  std::vector<int64_t> seqs;
  auto events = s.read_events(id, 0, 10000);
  EXPECT_TRUE(events.ok());
  for (const store::Event& e : *events) seqs.push_back(e.seq);
  return seqs;
}

int64_t submit(ServerFixture& f, const std::string& task) {
  auto r = f.call("POST", "/v1/builds", json{{"repo", testing::any_repo()}, {"task", task}}.dump());
  EXPECT_EQ(r.status, 201) << r.body;
  return f.json_of(r)["id"].get<int64_t>();
}

TEST(Server, SubmitThenFollowTheEventStreamToItsEnd) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  int64_t id = submit(f, "stream me");
  std::thread worker(run_fake_worker, std::ref(f.store()), id, 20, std::chrono::milliseconds(5));
  std::vector<int64_t> seqs;
  std::string end_status;
  auto err = f.client().stream("/v1/builds/" + std::to_string(id) + "/events", 0, [&](const SseMessage& m) {
    if (m.event == "end") {
      end_status = json::parse(m.data)["status"];
      return StreamControl::stop;
    }
    EXPECT_TRUE(m.id.has_value());
    EXPECT_EQ(json::parse(m.data)["seq"].get<int64_t>(), *m.id);
    EXPECT_EQ(json::parse(m.data)["kind"].get<std::string>(), m.event);
    seqs.push_back(*m.id);
    return StreamControl::keep_going;
  });
  worker.join();
  ASSERT_FALSE(err.has_value()) << *err;
  EXPECT_EQ(end_status, "succeeded");
  EXPECT_EQ(seqs, all_seqs(f.store(), id));  // every event, in order, once
  EXPECT_GE(seqs.size(), 22u);                // 20 logs + the store's status events
}

// The live path: the real worker pool claims the build, clones the repository, runs the scripted
// test model's tool calls in the sandbox, verifies, commits; the stream shows it all, then `end`.
TEST(Server, RealWorkersRunAScriptedBuildAndTheStreamShowsItsToolCalls) {
  TempDir dir;
  testing::make_git_repo(dir.path() / "repo");
  ServerFixture f(testing::live_config(dir, testing::scripted_turns_json(2, 2)));
  json body = {{"repo", (dir.path() / "repo").string()},
               {"task", "make calc.sh add"},
               {"verify", "test \"$(bash calc.sh)\" = 2"}};
  auto r = f.call("POST", "/v1/builds", body.dump());
  ASSERT_EQ(r.status, 201) << r.body;
  int64_t id = f.json_of(r)["id"];
  std::vector<std::string> calls, phases, outputs;
  std::vector<int64_t> seqs;
  std::string end_status, end_reason;
  auto err = f.client().stream("/v1/builds/" + std::to_string(id) + "/events", 0, [&](const SseMessage& m) {
    json e = json::parse(m.data);
    if (m.event == "end") {
      end_status = e["status"];
      end_reason = e["reason"];
      return StreamControl::stop;
    }
    seqs.push_back(*m.id);
    if (m.event == "tool_call") calls.push_back(e["payload"]["name"]);
    if (m.event == "tool_result") outputs.push_back(e["payload"]["output"]);
    if (m.event == "status" && e["payload"].contains("phase")) phases.push_back(e["payload"]["phase"]);
    return StreamControl::keep_going;
  });
  ASSERT_FALSE(err.has_value()) << *err;
  EXPECT_EQ(end_status, "succeeded");
  EXPECT_EQ(end_reason, "verified");
  EXPECT_EQ(calls, (std::vector<std::string>{"bash", "bash", "str_replace", "submit"}));
  ASSERT_GE(outputs.size(), 2u);
  EXPECT_EQ(outputs[0], "[exit code 0]\n1\n");  // ran in the sandbox, in the clone
  EXPECT_EQ(outputs[1], "[exit code 0]\n2\n");
  for (const char* phase : {"setup", "agent", "verify", "commit"}) {
    EXPECT_NE(std::find(phases.begin(), phases.end(), phase), phases.end()) << "no status phase " << phase;
  }
  EXPECT_EQ(seqs, all_seqs(f.store(), id));
  auto diff = f.call("GET", "/v1/builds/" + std::to_string(id) + "/diff");
  EXPECT_NE(diff.body.find("+echo $((1 + 1))"), std::string::npos) << diff.body;
}

// Prometheus text: "# TYPE name kind" lines and "name{label="v",...} value" samples. Fails the
// test on a line that is neither; returns sample -> value and fills `types`.
std::map<std::string, double> parse_prometheus(const std::string& text, std::map<std::string, std::string>& types) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, kind;
      t >> name >> kind;
      types[name] = kind;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    std::string series = line.substr(0, space);
    size_t brace = series.find('{');
    std::string name = series.substr(0, brace);
    bool name_ok = !name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_:0123456789") == std::string::npos;
    bool labels_ok = brace == std::string::npos || series.back() == '}';
    EXPECT_TRUE(space != std::string::npos && name_ok && labels_ok) << "not a sample: " << line;
    EXPECT_TRUE(types.count(name)) << "sample before its # TYPE: " << line;
    samples[series] = std::stod(line.substr(space + 1));
  }
  return samples;
}

TEST(Server, SandboxFailureReasonsFromSandboxResults) {
  auto reason = [](json r) { return agent::sandbox_failure_reason(r); };
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 0}, {"signal", 0}, {"timed_out", false}}), "");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 1}, {"signal", 0}, {"timed_out", false}}), "");  // the command's own
  EXPECT_EQ(reason({{"ok", false}, {"exit_code", -1}, {"error", "bwrap: not found"}}), "start_failed");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 143}, {"timed_out", true}}), "wall_timeout");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 128 + SIGXCPU}}), "cpu_limit");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 128 + SIGXFSZ}}), "file_size_limit");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 137}}), "killed");
  EXPECT_EQ(reason({{"ok", true}, {"exit_code", 137}, {"cancelled", true}}), "");  // cancelled by kiln
  EXPECT_EQ(reason({{"path", "a.txt"}}), "");  // not a command
}

// /metrics after a real build whose command the sandbox kills at its timeout: every family the
// issue lists is there, parses, and counts what happened.
TEST(Server, MetricsHaveEveryFamilyAndCountABuildAndASandboxTimeout) {
  TempDir dir;
  testing::make_git_repo(dir.path() / "repo");
  json turns = json::array({{{"reasoning", "Run the slow thing, but not for long."},
                             {"calls", {{{"name", "bash"}, {"arguments", {{"command", "sleep 30"}, {"timeout", 1}}}}}}},
                            {{"calls", {{{"name", "submit"}, {"arguments", {{"summary", "done"}}}}}}}});
  ServerFixture f(testing::live_config(dir, turns.dump()));
  std::map<std::string, std::string> types;
  auto before = parse_prometheus(f.call("GET", "/metrics").body, types);
  auto r = f.call("POST", "/v1/builds", json{{"repo", (dir.path() / "repo").string()}, {"task", "wait"}}.dump());
  ASSERT_EQ(r.status, 201);
  int64_t id = f.json_of(r)["id"];
  ASSERT_EQ(f.wait_for_end(id).value("status", ""), "succeeded");

  auto scrape = f.call("GET", "/metrics");
  EXPECT_EQ(scrape.content_type.rfind("text/plain; version=0.0.4", 0), 0u) << scrape.content_type;
  types.clear();
  auto m = parse_prometheus(scrape.body, types);
  EXPECT_EQ(types["kiln_builds"], "gauge");
  EXPECT_EQ(types["kiln_queue_depth"], "gauge");
  EXPECT_EQ(types["kiln_tokens_total"], "counter");
  EXPECT_EQ(types["kiln_decode_tokens_per_second"], "gauge");
  EXPECT_EQ(types["kiln_http_requests_total"], "counter");
  EXPECT_EQ(types["kiln_sandbox_failures_total"], "counter");
  EXPECT_EQ(types["kiln_kv_pages"], "gauge");  // samples per loaded engine model (model_host_test)
  EXPECT_EQ(types["kiln_kv_pages_in_use"], "gauge");
  EXPECT_EQ(types["kiln_kv_preemptions_total"], "counter");
  for (const char* status : {"queued", "running", "succeeded", "failed", "cancelled", "error"}) {
    EXPECT_TRUE(m.count("kiln_builds{status=\"" + std::string(status) + "\"}")) << status;
  }
  EXPECT_EQ(m["kiln_builds{status=\"succeeded\"}"], 1);
  EXPECT_EQ(m["kiln_queue_depth"], 0);
  for (const char* kind : {"prefilled", "cached", "generated", "reasoning"}) {
    EXPECT_TRUE(m.count("kiln_tokens_total{kind=\"" + std::string(kind) + "\"}")) << kind;
  }
  EXPECT_GT(m["kiln_tokens_total{kind=\"generated\"}"], 0);
  EXPECT_GT(m["kiln_tokens_total{kind=\"reasoning\"}"], 0);
  EXPECT_GT(m["kiln_decode_tokens_per_second{model=\"scripted-test\"}"], 0);
  EXPECT_EQ(m["kiln_http_requests_total{route=\"/v1/builds\",code=\"201\"}"], 1);
  EXPECT_GE(m["kiln_http_requests_total{route=\"/metrics\",code=\"200\"}"], 1);
  const std::string timeouts = "kiln_sandbox_failures_total{reason=\"wall_timeout\"}";
  EXPECT_EQ(m[timeouts] - before[timeouts], 1) << scrape.body;
  for (const char* reason : {"start_failed", "cpu_limit", "file_size_limit", "killed", "unusable"}) {
    EXPECT_TRUE(m.count("kiln_sandbox_failures_total{reason=\"" + std::string(reason) + "\"}")) << reason;
  }
}

// An engine model through the whole server: not loaded until a build uses it, then unloaded by
// the dispatcher's sweeper once idle for its idle_unload_seconds; /v1/models shows each state.
TEST(Server, EngineModelLoadsOnFirstUseAndUnloadsWhenIdle) {
  TempDir dir;
  testing::make_git_repo(dir.path() / "repo");
  ServerConfig config = testing::live_config(dir, testing::scripted_turns_json(1, 0));
  ModelConfig tiny;
  tiny.name = "tiny";
  tiny.path = (dir.path() / "tiny").string();
  tiny.kv_budget_bytes = 8ull << 20;
  tiny.max_sessions = 1;
  tiny.threads = 1;
  tiny.idle_unload_seconds = 1;
  ASSERT_TRUE(engine::make_tiny_model(tiny.path, engine::TinyModelOptions{}).ok());
  config.models.push_back(tiny);
  ServerFixture f(config);
  auto residency = [&] {
    json doc = f.json_of(f.call("GET", "/v1/models"));
    for (const json& m : doc["models"])
      if (m["name"] == "tiny") return json(m["residency"]);
    return json();
  };
  EXPECT_EQ(residency()["state"], "unloaded");
  EXPECT_EQ(residency()["loads"], 0);

  json body = {{"repo", (dir.path() / "repo").string()}, {"task", "t"}, {"model", "tiny"}, {"limits", {{"steps", 1}}}};
  auto r = f.call("POST", "/v1/builds", body.dump());
  ASSERT_EQ(r.status, 201) << r.body;
  int64_t id = f.json_of(r)["id"];
  const json end = f.wait_for_end(id);
  ASSERT_TRUE(end.contains("reason")) << end.dump();
  EXPECT_NE(end.value("reason", ""), "model_error") << "the tiny model should load and run";  // random weights: any other end
  EXPECT_EQ(residency()["loads"], 1);
  bool unloaded = false;
  for (int i = 0; i < 60 && !unloaded; ++i) {
    unloaded = residency()["state"] == "unloaded";
    if (!unloaded) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(unloaded) << residency();
  EXPECT_EQ(residency()["unloads"], 1);
}

TEST(Server, ReconnectWithLastEventIdHasNoGapAndNoDuplicate) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  int64_t id = submit(f, "reconnect");
  std::thread worker(run_fake_worker, std::ref(f.store()), id, 60, std::chrono::milliseconds(3));
  std::vector<int64_t> seqs;
  bool ended = false;
  int connections = 0;
  std::string target = "/v1/builds/" + std::to_string(id) + "/events";
  while (!ended && connections < 50) {
    ++connections;
    int taken = 0;
    int64_t last = seqs.empty() ? 0 : seqs.back();
    auto err = f.client().stream(target, last, [&](const SseMessage& m) {
      if (m.event == "end") {
        ended = true;
        return StreamControl::stop;
      }
      seqs.push_back(*m.id);
      return ++taken == 7 ? StreamControl::stop : StreamControl::keep_going;  // drop mid-stream
    });
    ASSERT_FALSE(err.has_value()) << *err;
  }
  worker.join();
  ASSERT_TRUE(ended);
  EXPECT_GT(connections, 3);
  EXPECT_EQ(seqs, all_seqs(f.store(), id));
}

TEST(Server, TwoHundredConcurrentSubmissionsAllLand) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  std::atomic<int> created{0};
  std::vector<std::thread> threads;
  std::mutex mu;
  std::set<int64_t> ids;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        ClientResponse r;
        // Built by appends: `"t" + std::to_string(…)` tripped a GCC 12 -Wrestrict false positive.
        std::string task = std::to_string(t);
        task.insert(task.begin(), 't');
        task += '-';
        task += std::to_string(i);
        std::string body = json{{"repo", testing::any_repo()}, {"task", task}}.dump();
        if (f.client().request("POST", "/v1/builds", body, r)) continue;
        if (r.status != 201) continue;
        ++created;
        std::lock_guard lock(mu);
        ids.insert(json::parse(r.body)["id"].get<int64_t>());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(created.load(), 200);
  EXPECT_EQ(ids.size(), 200u);
  store::ListQuery query;
  query.limit = 1000;
  auto page = f.store().list(query);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->builds.size(), 200u);
  EXPECT_EQ(f.server().http_metrics().count("/v1/builds", 201), 200u);
}

TEST(Server, BadRequestsOnTheWireGetJsonErrors) {
  TempDir dir;
  ServerConfig config = testing::test_config(dir);
  config.max_body_bytes = 4096;
  ServerFixture f(config);
  auto check = [&](const ClientResponse& r, int status, const char* field) {
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["field"], field) << r.body;
  };
  check(f.call("POST", "/v1/builds", "{\"repo\": "), 400, "body");
  check(f.call("POST", "/v1/builds", R"({"repo":"r","task":7})"), 400, "task");
  check(f.call("POST", "/v1/builds", R"({"repo":"r","task":"x","extra":1})"), 400, "extra");
  check(f.call("POST", "/v1/builds", std::string(10000, ' ')), 413, "body");
  check(f.call("GET", "/v1/unknown"), 404, "path");
  check(f.call("GET", "/v1/builds/..%2f..%2fetc%2fpasswd"), 400, "id");
  check(f.call("GET", "/v1/builds/1/../../../etc/passwd"), 400, "path");
  EXPECT_EQ(f.call("GET", "/healthz").status, 200);  // still serving
}

TEST(Server, KeepAliveServesSeveralRequestsOnOneConnection) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  RawSocket sock(f.server().port());
  ASSERT_TRUE(sock.connected());
  std::string got;
  sock.send_all("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/builds HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(sock.read_until("\"builds\"", got)) << got;
  EXPECT_NE(got.find("{\"status\":\"ok\"}"), std::string::npos);
  sock.send_all("GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(sock.read_until("no route", got));
  EXPECT_TRUE(sock.closed_by_peer());
}

TEST(Server, IdleStreamsGetPingsAndSlowClientsAreDropped) {
  TempDir dir;
  ServerConfig config = testing::test_config(dir);
  config.sse_ping_seconds = 1;
  config.sse_buffer_bytes = 64 * 1024;
  config.sse_stall_seconds = 1;  // a client that stays paused (never reads) is dropped after this
  ServerFixture f(config);
  int64_t id = submit(f, "slow client");
  std::string request = "GET /v1/builds/" + std::to_string(id) +
                        "/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n";
  {
    // Closed once pinged: a second client that stops reading would be dropped as well, maybe first.
    RawSocket pinged(f.server().port());
    pinged.send_all(request);
    std::string got;
    ASSERT_TRUE(pinged.read_until(": ping\n\n", got)) << got;
    EXPECT_NE(got.find("Content-Type: text/event-stream"), std::string::npos);
  }

  RawSocket slow(f.server().port(), /*rcvbuf=*/4096);
  slow.send_all(request);  // and never read
  int attempt = testing::claim_build(f.store(), id);
  std::string big = json{{"text", std::string(32 * 1024, 'x')}}.dump();
  for (int i = 0; i < 600 && f.server().hub().dropped_count() == 0; ++i) {
    ASSERT_TRUE(f.store().append_event(id, attempt, "log", big).ok());
  }
  // Its kernel buffers fill first, then it stays paused for sse_stall_seconds.
  for (int i = 0; i < 300 && f.server().hub().dropped_count() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(f.server().hub().dropped_count(), 1u);  // else the pings below keep it open forever
  EXPECT_TRUE(slow.closed_by_peer());
  EXPECT_EQ(f.call("GET", "/healthz").status, 200);  // the server is fine
}

TEST(Server, ReplayFromTheStartOfMoreThanTheBufferGetsEveryEventAndEnd) {
  // A whole page used to be queued in one pass: past sse_buffer_bytes the client was dropped
  // with no `end` (a large build's log, replayed).
  TempDir dir;
  ServerConfig config = testing::test_config(dir);
  config.sse_buffer_bytes = 32 * 1024;
  ServerFixture f(config);
  int64_t id = submit(f, "large log");
  int attempt = testing::claim_build(f.store(), id);
  std::string line = json{{"text", std::string(4000, 'x')}}.dump();
  for (int i = 0; i < 48; ++i) ASSERT_TRUE(f.store().append_event(id, attempt, "log", line).ok());  // ~6x the buffer
  store::FinishRequest fin;
  fin.status = store::BuildStatus::succeeded;
  fin.reason = store::OutcomeReason::no_verify;
  ASSERT_TRUE(f.store().finish(id, attempt, fin).ok());

  RawSocket sock(f.server().port(), /*rcvbuf=*/4096);
  sock.send_all("GET /v1/builds/" + std::to_string(id) +
                "/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a slow reader: the buffer fills first
  std::string got = sock.read_to_eof();
  EXPECT_NE(got.find("event: end\n"), std::string::npos) << got.substr(0, 300);
  std::vector<int64_t> seqs;
  for (size_t pos = got.find("\nid: "); pos != std::string::npos; pos = got.find("\nid: ", pos + 1)) {
    seqs.push_back(std::stoll(got.substr(pos + 5)));
  }
  EXPECT_EQ(seqs, all_seqs(f.store(), id));
  EXPECT_EQ(f.server().hub().dropped_count(), 0u);
}

TEST(Server, HeadGetsTheHeadersAndNoBody) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  RawSocket sock(f.server().port());
  ASSERT_TRUE(sock.connected());
  sock.send_all("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string got = sock.read_to_eof();
  const std::string body = "{\"status\":\"ok\"}\n";
  size_t head_end = got.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << got;
  std::string head = got.substr(0, head_end);
  EXPECT_NE(head.find("Content-Length: " + std::to_string(body.size())), std::string::npos) << head;
  EXPECT_EQ(got.compare(head_end + 4, 9, "HTTP/1.1 "), 0) << "HEAD response has a body:\n" << got;
  EXPECT_EQ(got.size() - body.size(), got.rfind(body)) << got;  // the GET's body, once, at the end
  EXPECT_EQ(got.find(body), got.rfind(body)) << got;

  // Every GET route answers HEAD (the API ones too), and an event stream's HEAD does not stream.
  for (const char* target : {"/v1/builds", "/v1/models", "/metrics", "/v1/builds/1/events"}) {
    RawSocket s2(f.server().port());
    ASSERT_TRUE(s2.connected());
    s2.send_all(std::string("HEAD ") + target +
                " HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n");
    std::string reply = s2.read_to_eof();
    EXPECT_TRUE(reply.rfind("HTTP/1.1 200", 0) == 0 || reply.rfind("HTTP/1.1 404", 0) == 0) << target << ":\n" << reply;
    EXPECT_EQ(reply.find("\r\n\r\n") + 4, reply.size()) << target << ": HEAD response has a body:\n" << reply;
  }
}

TEST(Server, OversizedHeadersAndMalformedRequestsAreCounted) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  {
    RawSocket sock(f.server().port());
    sock.send_all("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
    std::string got;
    EXPECT_TRUE(sock.read_until("headers_too_large", got)) << got;
  }
  {
    RawSocket sock(f.server().port());
    sock.send_all("G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string got;
    EXPECT_TRUE(sock.read_until("bad_request", got)) << got;
  }
  EXPECT_EQ(f.server().http_metrics().count("oversized", 431), 1u);
  EXPECT_EQ(f.server().http_metrics().count("invalid", 400), 1u);
}

TEST(Server, StopClosesStreamsAndReturns) {
  TempDir dir;
  ServerFixture f(testing::test_config(dir));
  int64_t id = submit(f, "never finishes");
  std::atomic<bool> returned{false};
  std::thread reader([&] {
    auto err = f.client().stream("/v1/builds/" + std::to_string(id) + "/events", 0,
                                 [](const SseMessage&) { return StreamControl::keep_going; });
    returned = true;
  });
  for (int i = 0; i < 100 && f.server().hub().subscriber_count() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(f.server().hub().subscriber_count(), 1u);
  auto t0 = std::chrono::steady_clock::now();
  f.server().stop();
  reader.join();
  EXPECT_TRUE(returned.load());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST(Server, RefusesNonLoopbackWithoutToken) {
  TempDir dir;
  ServerConfig config = testing::test_config(dir);
  config.listen.host = "0.0.0.0";
  std::ostringstream log;
  std::string error;
  EXPECT_EQ(Server::start(config, log, error), nullptr);
  EXPECT_NE(error.find("token"), std::string::npos) << error;
}

TEST(Server, TokenIsRequiredOnTheWireWhenConfigured) {
  TempDir dir;
  ServerConfig config = testing::test_config(dir);
  config.token = "tok-123";
  ServerFixture f(config);  // its client sends the token
  EXPECT_EQ(f.call("GET", "/v1/builds").status, 200);
  ServerUrl url;
  url.port = std::to_string(f.server().port());
  Client anonymous(url, "");
  ClientResponse r;
  ASSERT_FALSE(anonymous.request("GET", "/v1/builds", "", r).has_value());
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(f.server().http_metrics().count("unauthorized", 401), 1u);
}

}  // namespace
}  // namespace kiln::server
