// The web page in headless Chromium against a running server: the build page streams the log
// (tool calls shown folded), the status turns `succeeded`, and a screenshot is saved under
// <build>/test-output/. Chromium is a Debian package (scripts/deps-extra.txt).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;

std::string chromium_binary() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "chromium";
}

// Runs headless Chromium (as root it needs --no-sandbox) with no network beyond the URL given.
// Returns its stdout (the DOM for --dump-dom).
std::string run_chromium(const std::string& profile, const std::string& extra_args, const std::string& url) {
  std::string cmd = "timeout 60 " + chromium_binary() +
                    " --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking"
                    " --disable-component-update --disable-sync --disable-extensions --disable-dev-shm-usage"
                    " --user-data-dir=" + profile + " " + extra_args + " '" + url + "' 2>/dev/null";
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[8192];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  ::pclose(pipe);
  return out;
}

// Plays a scripted build through the store: the tool calls and results a real agent emits.
void play_build(store::Store& s, int64_t id, int attempt) {
  auto emit = [&](const char* kind, const json& payload) {
    ASSERT_TRUE(s.append_event(id, attempt, kind, payload.dump()).ok());
  };
  emit("reasoning", {{"text", "I should look at the failing test first."}});
  emit("tool_call", {{"id", "c1"}, {"name", "bash"}, {"arguments", {{"command", "make test"}}}, {"step", 1}});
  emit("tool_result", {{"id", "c1"}, {"name", "bash"}, {"ok", false}, {"output", "FAIL: test_add\nexit 1"}});
  emit("tool_call", {{"id", "c2"}, {"name", "str_replace"},
                     {"arguments", {{"path", "calc.c"}, {"old_str", "a - b"}, {"new_str", "a + b"}}}, {"step", 2}});
  emit("tool_result", {{"id", "c2"}, {"name", "str_replace"}, {"ok", true}, {"output", "replaced 1 occurrence"}});
  emit("model_text", {{"text", "Fixed the sign in add()."}});
}

TEST(Web, BuildPageStreamsToolCallsAndTurnsSucceeded) {
  testing::TempDir dir;
  testing::ServerFixture f(testing::test_config(dir));
  auto submitted = f.call("POST", "/v1/builds", R"({"repo":"/tmp/calc","task":"make the tests pass","verify":"make test"})");
  ASSERT_EQ(submitted.status, 201);
  int64_t id = f.json_of(submitted)["id"];
  int attempt = testing::claim_build(f.store(), id);
  ASSERT_GT(attempt, 0);
  play_build(f.store(), id, attempt);

  // The build finishes before the page loads: headless Chromium's virtual-time budget does not
  // reliably wait for a still-open stream, so the page must get the whole log and `end` from SSE.
  {
    store::FinishRequest fin;
    fin.status = store::BuildStatus::succeeded;
    fin.reason = store::OutcomeReason::verified;
    fin.result_diff = "--- a/calc.c\n+++ b/calc.c\n@@ -1 +1 @@\n-  return a - b;\n+  return a + b;\n";
    ASSERT_TRUE(f.store().finish(id, attempt, fin).ok());
  }
  std::string page = f.url() + "/#/build/" + std::to_string(id);
  std::string dom = run_chromium((dir.path() / "profile1").string(), "--dump-dom --virtual-time-budget=20000", page);
  ASSERT_FALSE(dom.empty()) << "chromium printed nothing";
  EXPECT_NE(dom.find("tool call: bash"), std::string::npos) << dom;
  EXPECT_NE(dom.find("tool call: str_replace"), std::string::npos) << dom;
  EXPECT_NE(dom.find("<details class=\"tool-call\""), std::string::npos) << "tool calls are folded";
  EXPECT_NE(dom.find("class=\"ev ev-reasoning reasoning\""), std::string::npos) << "reasoning is dimmed";
  EXPECT_NE(dom.find("id=\"status\" class=\"status succeeded\">succeeded<"), std::string::npos) << dom;
  EXPECT_NE(dom.find("data-state=\"ended\""), std::string::npos) << dom;

  std::filesystem::path out_dir = std::filesystem::path(KILN_BINARY_DIR) / "test-output";
  std::filesystem::create_directories(out_dir);
  std::filesystem::path shot = out_dir / "web_build_page.png";
  std::filesystem::remove(shot);
  run_chromium((dir.path() / "profile2").string(),
               "--window-size=1280,1000 --virtual-time-budget=10000 --screenshot=" + shot.string(), page);
  ASSERT_TRUE(std::filesystem::exists(shot)) << "no screenshot at " << shot;
  EXPECT_GT(std::filesystem::file_size(shot), 5000u);
}

TEST(Web, BuildsListAndComparePagesRender) {
  testing::TempDir dir;
  testing::ServerFixture f(testing::test_config(dir));
  for (const char* model : {"test-model", "other-model"}) {
    auto b = f.store().submit(testing::spec_for("shared task", model));
    ASSERT_TRUE(b.ok());
    int attempt = testing::claim_build(f.store(), b->id);
    store::FinishRequest fin;
    fin.status = store::BuildStatus::succeeded;
    fin.reason = store::OutcomeReason::no_verify;
    store::BuildMetrics m;
    m.seconds_wall = std::string(model) == "test-model" ? 30 : 12;
    fin.metrics = m;
    ASSERT_TRUE(f.store().finish(b->id, attempt, fin).ok());
  }
  std::string list = run_chromium((dir.path() / "p1").string(), "--dump-dom --virtual-time-budget=5000", f.url() + "/#/");
  EXPECT_NE(list.find("<table id=\"builds\">"), std::string::npos) << list;
  EXPECT_NE(list.find("shared task"), std::string::npos);
  std::string cmp = run_chromium((dir.path() / "p2").string(), "--dump-dom --virtual-time-budget=5000",
                                 f.url() + "/#/compare?models=test-model,other-model");
  EXPECT_NE(cmp.find("<table id=\"compare\">"), std::string::npos) << cmp;
  EXPECT_NE(cmp.find("<svg width=\"640\""), std::string::npos) << "bar chart of median duration";
  EXPECT_NE(cmp.find("class=\"bar\""), std::string::npos);
}

}  // namespace
}  // namespace kiln::server
