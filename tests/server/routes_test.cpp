// Route functions called directly, without sockets, over a real SQLite store.
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "server/http_metrics.h"
#include "server/models.h"
#include "server/routes.h"
#include "store/store.h"
#include "test_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;
using testing::TempDir;

class RoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = testing::test_config(dir_);
    store::StoreOptions options;
    options.path = config_.db_path;
    options.allowed_models = std::set<std::string>{"test-model", "other-model"};
    auto opened = store::Store::open(options);
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    store_ = std::move(opened.value());
    models_ = std::make_unique<ModelRegistry>(config_.models);
    app_.config = &config_;
    app_.store = store_.get();
    app_.http_metrics = &metrics_;
    app_.models = models_.get();
  }

  RouteResult call(const std::string& method, const std::string& target, const std::string& body = {},
                   std::map<std::string, std::string> headers = {}) {
    return handle_request(make_request(method, target, body, headers), app_);
  }
  static json body_of(const RouteResult& r) { return json::parse(r.response.body); }
  // Asserts a JSON error with this status and field.
  static void expect_error(const RouteResult& r, int status, const std::string& field) {
    EXPECT_EQ(r.response.status, status) << r.response.body;
    json j = json::parse(r.response.body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r.response.body;
    EXPECT_TRUE(j["error"]["code"].is_string());
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    if (field.empty()) {
      EXPECT_TRUE(j["error"]["field"].is_null()) << r.response.body;
    } else {
      EXPECT_EQ(j["error"]["field"], field) << r.response.body;
    }
  }

  TempDir dir_;
  ServerConfig config_;
  std::unique_ptr<store::Store> store_;
  HttpMetrics metrics_;
  std::unique_ptr<ModelRegistry> models_;
  App app_;
};

TEST_F(RoutesTest, SubmitReturns201WithTheBuildAndDefaults) {
  auto r = call("POST", "/v1/builds", json{{"repo", testing::any_repo()}, {"task", "fix the bug"}, {"verify", "make test"}}.dump());
  ASSERT_EQ(r.response.status, 201) << r.response.body;
  json b = body_of(r);
  EXPECT_GT(b["id"].get<int64_t>(), 0);
  EXPECT_EQ(b["status"], "queued");
  EXPECT_EQ(b["model"], "test-model");  // the first configured model is the default
  EXPECT_EQ(b["verify"], "make test");
  EXPECT_EQ(b["limits"]["steps"], config_.limits.steps);
  EXPECT_EQ(r.route, "/v1/builds");
  auto stored = store_->get(b["id"].get<int64_t>());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->spec.task, "fix the bug");
}

TEST_F(RoutesTest, SubmitValidationNamesTheField) {
  expect_error(call("POST", "/v1/builds", "{not json"), 400, "body");
  expect_error(call("POST", "/v1/builds", "[1,2]"), 400, "body");
  expect_error(call("POST", "/v1/builds", R"({"task":"x"})"), 400, "repo");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r"})"), 400, "task");
  expect_error(call("POST", "/v1/builds", R"({"repo":5,"task":"x"})"), 400, "repo");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","colour":"red"})"), 400, "colour");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","limits":{"steps":"ten"}})"), 400, "limits.steps");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","limits":{"steps":-1}})"), 400, "limits.steps");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","limits":{"bogus":1}})"), 400, "limits.bogus");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","limits":[]})"), 400, "limits");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","priority":1.5})"), 400, "priority");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","model":"nope"})"), 400, "model");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"   "})"), 400, "task");
  // A relative path would be resolved in the server's working directory, not the caller's.
  expect_error(call("POST", "/v1/builds", R"({"repo":"projects/app","task":"x"})"), 400, "repo");
  auto page = store_->list({});
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->builds.empty()) << "a rejected submit wrote a build";
}

// A local repository is checked at submit: a wrong path or ref is a 400 naming the field, not a
// build that errors after waiting in the queue.
TEST_F(RoutesTest, SubmitChecksALocalRepositoryAndItsRef) {
  auto body = [](const std::string& repo, const std::string& ref) {
    return json{{"repo", repo}, {"ref", ref}, {"task", "x"}}.dump();
  };
  expect_error(call("POST", "/v1/builds", body((dir_.path() / "no-such-repo").string(), "")), 400, "repo");
  expect_error(call("POST", "/v1/builds", body(testing::any_repo(), "no-such-branch")), 400, "ref");
  // One that tracks `.kiln` (kiln's own directory in the workspace) is refused too, naming it.
  const std::filesystem::path dot_kiln = dir_.path() / "tracks-dot-kiln";
  testing::make_git_repo(dot_kiln);
  std::ofstream(dot_kiln / ".kiln") << "the user's own\n";
  ASSERT_EQ(std::system(("cd '" + dot_kiln.string() + "' && git add .kiln && git -c user.name=kiln "
                         "-c user.email=kiln@example.invalid commit -qm dot-kiln").c_str()), 0);
  auto refused = call("POST", "/v1/builds", body(dot_kiln.string(), "main"));
  expect_error(refused, 400, "repo");
  EXPECT_NE(refused.response.body.find("tracks `.kiln`"), std::string::npos) << refused.response.body;
  auto page = store_->list({});
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->builds.empty()) << "a rejected submit wrote a build";
  EXPECT_EQ(call("POST", "/v1/builds", body(testing::any_repo(), "main")).response.status, 201);
}

// A source check that does not answer (a hung network mount) does not hold the request: past
// the wait the build is accepted while the check still runs, and its clone will report the source.
// A check that answers in time still decides.
TEST_F(RoutesTest, SubmitDoesNotWaitForASourceCheckThatHangs) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false, returned = false;
  };
  auto gate = std::make_shared<Gate>();
  app_.source_check_wait = std::chrono::milliseconds(50);
  app_.source_check = [gate](const std::string&, const std::string&) {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->cv.wait(lock, [&] { return gate->open; });
    gate->returned = true;
    gate->cv.notify_all();
    return SourceCheckResult{"would have refused", "repo"};
  };
  // On a thread of its own, so that a request that waits for the check fails here, not hangs.
  auto submitted = std::async(std::launch::async, [&] {
    return call("POST", "/v1/builds", json{{"repo", "/mnt/hung/repo"}, {"task", "x"}}.dump());
  });
  const bool answered = submitted.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(answered) << "the submit waited for a source check that hangs";
  {
    std::unique_lock<std::mutex> lock(gate->mu);
    EXPECT_FALSE(gate->returned);
    gate->open = true;
    gate->cv.notify_all();
    gate->cv.wait(lock, [&] { return gate->returned; });  // the detached check ends before the test
  }
  const auto r = submitted.get();
  EXPECT_EQ(r.response.status, 201) << r.response.body;
  app_.source_check_wait = std::chrono::milliseconds(10000);
  app_.source_check = [](const std::string&, const std::string&) { return SourceCheckResult{"no such repo", "repo"}; };
  expect_error(call("POST", "/v1/builds", json{{"repo", "/srv/repo"}, {"task", "x"}}.dump()), 400, "repo");
}

TEST_F(RoutesTest, SubmitRefusesLimitsAboveTheirBoundsAndPriorityOutsideInt64) {
  // Each of these used to be a 201 whose build then failed at once (the worker's int step count
  // and steady_clock deadline overflowed) or stored a wrapped priority (2^64 - 1 read as -1).
  const std::pair<const char*, const char*> bad[] = {
      {R"({"steps":3000000000})", "limits.steps"},
      {R"({"steps":1000001})", "limits.steps"},
      {R"({"steps":18446744073709551615})", "limits.steps"},
      {R"({"wall_seconds":10000000000})", "limits.wall_seconds"},
      {R"({"tokens":10000000000})", "limits.tokens"},
  };
  for (const auto& [limits, field] : bad) {
    expect_error(call("POST", "/v1/builds", std::string(R"({"repo":"/r","task":"x","limits":)") + limits + "}"), 400,
                 field);
  }
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","priority":18446744073709551615})"), 400,
               "priority");
  expect_error(call("POST", "/v1/builds", R"({"repo":"/r","task":"x","priority":9223372036854775808})"), 400,
               "priority");
  auto page = store_->list({});
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->builds.empty()) << "a rejected submit wrote a build";

  // The bounds themselves are fine.
  auto r = call("POST", "/v1/builds",
                R"({"repo":")" + testing::any_repo() +
                    R"(","task":"x","limits":{"steps":1000000,"tokens":1000000000,"wall_seconds":10000000},)"
                    R"("priority":9223372036854775807})");
  ASSERT_EQ(r.response.status, 201) << r.response.body;
  EXPECT_EQ(body_of(r)["limits"]["wall_seconds"], 10000000);
  EXPECT_EQ(body_of(r)["priority"], INT64_MAX);
  r = call("POST", "/v1/builds", R"({"repo":")" + testing::any_repo() + R"(","task":"y","priority":-9223372036854775808})");
  ASSERT_EQ(r.response.status, 201) << r.response.body;
  EXPECT_EQ(body_of(r)["priority"], INT64_MIN);
}

TEST_F(RoutesTest, InvalidUtf8InEchoedInputStillGetsAJsonError) {
  // Error messages quote the input; a strict dump() used to throw on it (a 500).
  const std::string replaced = "\xEF\xBF\xBD";  // U+FFFD
  expect_error(call("GET", "/v1/builds?limit=%ff"), 400, "limit");
  expect_error(call("GET", "/v1/builds/%ff"), 400, "id");
  expect_error(call("GET", "/v1/compare?since=%ff"), 400, "since");
  expect_error(call("GET", "/v1/builds?%ff=1"), 400, replaced);
  expect_error(call("GET", "/nope%ff"), 404, "path");
  auto b = store_->submit(testing::spec_for("utf8"));
  ASSERT_TRUE(b.ok());
  std::string events = "/v1/builds/" + std::to_string(b->id) + "/events";
  expect_error(call("GET", events + "?after=%c3%28"), 400, "after");
  expect_error(call("GET", events, "", {{"Accept", "text/event-stream"}, {"Last-Event-ID", "\xff"}}), 400,
               "Last-Event-ID");
  auto r = call("GET", "/v1/builds?limit=%ff");
  EXPECT_NE(r.response.body.find("got '" + replaced + "'"), std::string::npos) << r.response.body;
}

TEST_F(RoutesTest, MalformedPercentEncodingInTheQueryIsA400NamingTheKey) {
  // Used to be dropped silently: status=%zzrunning listed every build, unfiltered.
  ASSERT_TRUE(store_->submit(testing::spec_for("queued")).ok());
  auto r = call("GET", "/v1/builds?status=%zzrunning");
  expect_error(r, 400, "status");
  EXPECT_EQ(body_of(r)["error"]["code"], "invalid_parameter");
  expect_error(call("GET", "/v1/builds?limit=5%"), 400, "limit");
  expect_error(call("GET", "/v1/builds?model=test-model&%zz=1"), 400, "query");
  EXPECT_EQ(call("GET", "/v1/builds?status=queued&model=test%2Dmodel").response.status, 200);
}

TEST_F(RoutesTest, HasDiffIsReportedWithoutLoadingTheDiff) {
  auto with_diff = store_->submit(testing::spec_for("with diff"));
  auto without = store_->submit(testing::spec_for("without diff"));
  ASSERT_TRUE(with_diff.ok() && without.ok());
  for (int64_t id : {with_diff->id, without->id}) {
    int attempt = testing::claim_build(*store_, id);
    store::FinishRequest fin;
    fin.status = store::BuildStatus::succeeded;
    fin.reason = store::OutcomeReason::no_verify;
    if (id == with_diff->id) fin.result_diff = "--- a/x\n+++ b/x\n";
    ASSERT_TRUE(store_->finish(id, attempt, fin).ok());
  }
  EXPECT_TRUE(body_of(call("GET", "/v1/builds/" + std::to_string(with_diff->id)))["has_diff"].get<bool>());
  EXPECT_FALSE(body_of(call("GET", "/v1/builds/" + std::to_string(without->id)))["has_diff"].get<bool>());
  json list = body_of(call("GET", "/v1/builds"));
  ASSERT_EQ(list["builds"].size(), 2u);
  EXPECT_FALSE(list["builds"][0]["has_diff"].get<bool>());  // newest first
  EXPECT_TRUE(list["builds"][1]["has_diff"].get<bool>());
}

TEST_F(RoutesTest, IdsAndPathsAreCheckedBeforeTheStore) {
  expect_error(call("GET", "/v1/builds/abc"), 400, "id");
  expect_error(call("GET", "/v1/builds/0"), 400, "id");
  expect_error(call("GET", "/v1/builds/-3"), 400, "id");
  expect_error(call("GET", "/v1/builds/..%2F..%2Fetc%2Fpasswd/events"), 400, "id");
  expect_error(call("GET", "/v1/builds/../../etc/passwd"), 400, "path");
  expect_error(call("GET", "/v1/builds/%2e%2e/diff"), 400, "path");
  expect_error(call("GET", "/v1/builds/99999"), 404, "id");
  expect_error(call("GET", "/v1/nothing"), 404, "path");
  expect_error(call("GET", "/v1/builds/1/frobnicate"), 404, "path");
  expect_error(call("DELETE", "/v1/builds"), 405, "method");
  expect_error(call("GET", "/v1/builds/1/cancel"), 405, "method");
}

TEST_F(RoutesTest, ListPagesNewestFirstAndFilters) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store_->submit(testing::spec_for("t" + std::to_string(i))).ok());
  ASSERT_TRUE(store_->submit(testing::spec_for("o", "other-model")).ok());
  auto r = call("GET", "/v1/builds?limit=4");
  ASSERT_EQ(r.response.status, 200);
  json page = body_of(r);
  ASSERT_EQ(page["builds"].size(), 4u);
  EXPECT_EQ(page["builds"][0]["task"], "o");
  ASSERT_TRUE(page["next_cursor"].is_number());
  auto r2 = call("GET", "/v1/builds?limit=4&cursor=" + std::to_string(page["next_cursor"].get<int64_t>()));
  EXPECT_EQ(body_of(r2)["builds"].size(), 2u);
  EXPECT_EQ(body_of(call("GET", "/v1/builds?model=other-model"))["builds"].size(), 1u);
  EXPECT_EQ(body_of(call("GET", "/v1/builds?status=running"))["builds"].size(), 0u);
  expect_error(call("GET", "/v1/builds?status=sleeping"), 400, "status");
  expect_error(call("GET", "/v1/builds?limit=0"), 400, "limit");
  expect_error(call("GET", "/v1/builds?limit=abc"), 400, "limit");
  expect_error(call("GET", "/v1/builds?colour=red"), 400, "colour");
}

TEST_F(RoutesTest, EventsPageCancelAndDiff) {
  auto b = store_->submit(testing::spec_for("events"));
  ASSERT_TRUE(b.ok());
  int64_t id = b->id;
  int attempt = testing::claim_build(*store_, id);
  ASSERT_GT(attempt, 0);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(store_->append_event(id, attempt, "log", json{{"text", "line " + std::to_string(i)}}.dump()).ok());
  }
  std::string base = "/v1/builds/" + std::to_string(id);
  json page = body_of(call("GET", base + "/events?after=0&limit=3"));
  ASSERT_EQ(page["events"].size(), 3u);
  EXPECT_FALSE(page["terminal"].get<bool>());
  int64_t next = page["next_after"];
  json rest = body_of(call("GET", base + "/events?after=" + std::to_string(next)));
  EXPECT_EQ(rest["events"][0]["seq"].get<int64_t>(), next + 1);  // no gap, no repeat
  expect_error(call("GET", base + "/diff"), 404, "id");            // not finished, no diff yet

  store::FinishRequest fin;
  fin.status = store::BuildStatus::succeeded;
  fin.reason = store::OutcomeReason::verified;
  fin.result_diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n";
  ASSERT_TRUE(store_->finish(id, attempt, fin).ok());
  auto diff = call("GET", base + "/diff");
  EXPECT_EQ(diff.response.status, 200);
  EXPECT_EQ(diff.response.content_type.rfind("text/x-diff", 0), 0u);
  EXPECT_EQ(diff.response.body, *fin.result_diff);
  json all = body_of(call("GET", base + "/events?after=0&limit=1000"));
  EXPECT_TRUE(all["terminal"].get<bool>());
  EXPECT_EQ(all["status"], "succeeded");
  expect_error(call("POST", base + "/cancel"), 409, "id");  // already finished

  auto queued = store_->submit(testing::spec_for("to cancel"));
  ASSERT_TRUE(queued.ok());
  auto c = call("POST", "/v1/builds/" + std::to_string(queued->id) + "/cancel");
  ASSERT_EQ(c.response.status, 200) << c.response.body;
  EXPECT_TRUE(body_of(c)["immediate"].get<bool>());
  EXPECT_EQ(body_of(c)["build"]["status"], "cancelled");
}

TEST_F(RoutesTest, SseRequestBecomesAStreamStartHonouringLastEventId) {
  auto b = store_->submit(testing::spec_for("sse"));
  ASSERT_TRUE(b.ok());
  std::string target = "/v1/builds/" + std::to_string(b->id) + "/events";
  auto r = call("GET", target, "", {{"Accept", "text/event-stream"}, {"Last-Event-ID", "7"}});
  ASSERT_TRUE(r.stream.has_value());
  EXPECT_EQ(r.stream->build_id, b->id);
  EXPECT_EQ(r.stream->after_seq, 7);
  EXPECT_EQ(r.route, "/v1/builds/{id}/events");
  expect_error(call("GET", target, "", {{"Accept", "text/event-stream"}, {"Last-Event-ID", "x"}}), 400, "Last-Event-ID");
  auto missing = call("GET", "/v1/builds/424242/events", "", {{"Accept", "text/event-stream"}});
  EXPECT_FALSE(missing.stream.has_value());
  EXPECT_EQ(missing.response.status, 404);
}

TEST_F(RoutesTest, TokenGuardsTheApiButNotHealthOrThePage) {
  config_.token = "s3cret-token";
  expect_error(call("GET", "/v1/builds"), 401, "authorization");
  expect_error(call("GET", "/v1/builds", "", {{"Authorization", "Bearer wrong"}}), 401, "authorization");
  expect_error(call("GET", "/metrics", "", {{"Authorization", "s3cret-token"}}), 401, "authorization");
  EXPECT_EQ(call("GET", "/v1/builds", "", {{"Authorization", "Bearer s3cret-token"}}).response.status, 200);
  EXPECT_EQ(call("GET", "/healthz").response.status, 200);
  auto page = call("GET", "/");
  EXPECT_EQ(page.response.status, 200);
  EXPECT_NE(page.response.body.find("<title>kiln</title>"), std::string::npos);
}

TEST_F(RoutesTest, MetricsShowStoreCountsAndHttpCounters) {
  ASSERT_TRUE(store_->submit(testing::spec_for("a")).ok());
  ASSERT_TRUE(store_->submit(testing::spec_for("b")).ok());
  metrics_.record("/v1/builds", 201);
  metrics_.record("/v1/builds", 201);
  metrics_.record("unmatched", 404);
  auto r = call("GET", "/metrics");
  ASSERT_EQ(r.response.status, 200);
  EXPECT_EQ(r.response.content_type.rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& m = r.response.body;
  EXPECT_NE(m.find("kiln_builds{status=\"queued\"} 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_queue_depth 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_tokens_total{kind=\"generated\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_http_requests_total{route=\"/v1/builds\",code=\"201\"} 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_http_requests_total{route=\"unmatched\",code=\"404\"} 1\n"), std::string::npos) << m;
}

TEST_F(RoutesTest, CompareReturnsTheStoreReportAndValidatesModels) {
  // Two models on the same task; both succeed, A takes longer.
  for (const char* model : {"test-model", "other-model"}) {
    auto b = store_->submit(testing::spec_for("same task", model));
    ASSERT_TRUE(b.ok());
    int attempt = testing::claim_build(*store_, b->id);
    store::FinishRequest fin;
    fin.status = store::BuildStatus::succeeded;
    fin.reason = store::OutcomeReason::no_verify;
    store::BuildMetrics metrics;
    metrics.seconds_wall = std::string(model) == "test-model" ? 20 : 10;
    fin.metrics = metrics;
    ASSERT_TRUE(store_->finish(b->id, attempt, fin).ok());
  }
  auto r = call("GET", "/v1/compare?models=test-model,other-model");
  ASSERT_EQ(r.response.status, 200) << r.response.body;
  json report = body_of(r);
  ASSERT_EQ(report["models"].size(), 2u);
  ASSERT_EQ(report["pairs"].size(), 1u);
  EXPECT_EQ(report["pairs"][0]["tasks"], 1);
  EXPECT_EQ(report["pairs"][0]["both_succeeded"], 1);
  expect_error(call("GET", "/v1/compare?models=a,,b"), 400, "models");
  expect_error(call("GET", "/v1/compare?since=yesterday"), 400, "since");

  // since: the builds above finished just now; an hour ahead leaves nothing, the past keeps both.
  int64_t later_s = store_->now_ms() / 1000 + 3600;
  json none = body_of(call("GET", "/v1/compare?models=test-model&since=" + std::to_string(later_s)));
  EXPECT_EQ(none["models"][0]["builds"], 0) << none;
  json both = body_of(call("GET", "/v1/compare?models=test-model,other-model&since=2000-01-01T00:00:00Z"));
  EXPECT_EQ(both["models"][0]["builds"], 1) << both;
  EXPECT_EQ(both["pairs"][0]["tasks"], 1) << both;
  for (const char* bad : {"2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01", "2026-01-01T00:00:00",
                          "-5", "1.5", "2026-01-01T00:00:00+0100", "now"}) {
    expect_error(call("GET", std::string("/v1/compare?since=") + bad), 400, "since");
  }
}

TEST_F(RoutesTest, CompareRefusesAModelNeitherConfiguredNorUsedByAnyBuild) {
  // Used to answer 200 with an all-zero row for the typo.
  expect_error(call("GET", "/v1/compare?models=nope"), 400, "models");
  expect_error(call("GET", "/v1/compare?models=test-model,nope"), 400, "models");
  EXPECT_EQ(call("GET", "/v1/compare?models=test-model,other-model").response.status, 200);  // configured
  // A model no longer configured still compares while builds of it exist.
  ASSERT_TRUE(store_->submit(testing::spec_for("old", "other-model")).ok());
  config_.models.pop_back();
  auto r = call("GET", "/v1/compare?models=other-model");
  EXPECT_EQ(r.response.status, 200) << r.response.body;
}

TEST(Since, ParsesRfc3339AndUnixSeconds) {
  EXPECT_EQ(parse_since("0"), 0);
  EXPECT_EQ(parse_since("1769860800"), 1769860800000);
  EXPECT_EQ(parse_since("2026-01-31T12:00:00Z"), 1769860800000);  // date -u -d 2026-01-31T12:00:00Z +%s
  EXPECT_EQ(parse_since("2026-01-31t12:00:00z"), 1769860800000);
  EXPECT_EQ(parse_since("2026-01-31T14:30:00+02:30"), 1769860800000);
  EXPECT_EQ(parse_since("2026-01-31T14:30:00 02:30"), 1769860800000);  // '+' decoded as a space
  EXPECT_EQ(parse_since("2026-01-31T09:00:00-03:00"), 1769860800000);
  EXPECT_EQ(parse_since("2026-01-31T12:00:00.25Z"), 1769860800250);
  EXPECT_EQ(parse_since("2026-01-31T12:00:00.123456Z"), 1769860800123);
  EXPECT_EQ(parse_since("2024-02-29T00:00:00Z"), 1709164800000);  // leap day
  EXPECT_EQ(parse_since("1970-01-01T00:00:00Z"), 0);
  EXPECT_FALSE(parse_since("2023-02-29T00:00:00Z"));
  EXPECT_FALSE(parse_since("2026-01-31T24:00:00Z"));
  EXPECT_FALSE(parse_since("2026-01-31T12:00:00.Z"));
  EXPECT_FALSE(parse_since(""));
  EXPECT_FALSE(parse_since("2026-01-31T12:00:00Zjunk"));
}

TEST_F(RoutesTest, ModelsListsConfiguredModelsEvenWhenNotLoadable) {
  auto r = call("GET", "/v1/models");
  ASSERT_EQ(r.response.status, 200);
  json j = body_of(r);
  EXPECT_EQ(j["default_model"], "test-model");
  ASSERT_EQ(j["models"].size(), 2u);
  const json& m = j["models"][0];
  EXPECT_EQ(m["name"], "test-model");
  EXPECT_FALSE(m["loaded"].get<bool>());
  EXPECT_TRUE(m["architecture"].is_null());
  EXPECT_NE(m["architecture_error"].get<std::string>().find("no-such-model/config.json"), std::string::npos);
  EXPECT_EQ(m["stats"]["sessions_in_use"], 0);
}

TEST_F(RoutesTest, ModelsReadTheArchitectureFromConfigJson) {
  std::filesystem::create_directories(dir_.path() / "m");
  std::ofstream(dir_.path() / "m" / "config.json")
      << R"({"architectures":["Qwen3_5MoeForConditionalGeneration"],"text_config":{"model_type":"qwen3_5_moe",)"
      << R"("num_hidden_layers":4,"hidden_size":64,"num_experts":8,"layer_types":["linear_attention",)"
      << R"("linear_attention","linear_attention","full_attention"]}})";
  json arch;
  ASSERT_FALSE(read_architecture((dir_.path() / "m").string(), arch).has_value());
  EXPECT_EQ(arch["model_type"], "qwen3_5_moe");
  EXPECT_EQ(arch["num_hidden_layers"], 4);
  EXPECT_EQ(arch["full_attention_layers"], 1);
  EXPECT_EQ(arch["linear_attention_layers"], 3);
}

}  // namespace
}  // namespace kiln::server
