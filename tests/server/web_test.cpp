// The web page in headless Chromium against a running server: the build page streams the log of
// a build the real workers are running (tool calls shown folded) and then turns `succeeded`; a
// screenshot is saved under <build>/test-output/. Chromium is a Debian package
// (scripts/deps-extra.txt); the live page is driven over the DevTools pipe (chromium.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/worker.h"
#include "chromium.h"
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

// The page shown while the build runs. The build is held inside its last bash call until the
// test creates a gate file in the build's workspace, so "while it runs" is a fact, not a race.
TEST(Web, BuildPageStreamsToolCallsWhileTheBuildRunsThenTurnsSucceeded) {
  testing::TempDir dir;
  testing::make_git_repo(dir.path() / "repo");
  std::string gate = "while [ ! -e /workspace/.kiln/go ]; do sleep 0.05; done; echo released";
  testing::ServerFixture f(testing::live_config(dir, testing::scripted_turns_json(2, 2, gate)));
  json body = {{"repo", (dir.path() / "repo").string()},
               {"task", "make calc.sh add"},
               {"verify", "test \"$(bash calc.sh)\" = 2"}};
  auto submitted = f.call("POST", "/v1/builds", body.dump());
  ASSERT_EQ(submitted.status, 201) << submitted.body;
  int64_t id = f.json_of(submitted)["id"];

  testing::Chromium browser(dir.path() / "profile");
  ASSERT_EQ(browser.open(f.url() + "/#/build/" + std::to_string(id)), "");
  // Live: all the tool calls so far (the gate's included) are on the page and it says running.
  auto calls = [](const char* name, int n) {
    return "[...document.querySelectorAll('details.tool-call summary')].filter(s => s.textContent.endsWith('tool call: " +
           std::string(name) + "')).length >= " + std::to_string(n);
  };
  std::string running = std::string("(document.getElementById('status')||{}).textContent === 'running' && ") +
                        calls("bash", 3) + " && " + calls("str_replace", 1);
  ASSERT_TRUE(browser.wait_until(running, std::chrono::seconds(30))) << browser.error() << "\n"
                                                                       << browser.eval("document.body.innerHTML")->dump();
  EXPECT_EQ(f.json_of(f.call("GET", "/v1/builds/" + std::to_string(id)))["status"], "running");
  EXPECT_TRUE(*browser.eval("document.getElementById('log').getAttribute('data-state') === 'streaming'"));
  EXPECT_FALSE(*browser.eval(calls("submit", 1)));

  // Release the build; the same page follows it to the end.
  std::ofstream(agent::build_workspace(dir.path() / "workspaces", id) / ".kiln" / "go") << "go\n";
  ASSERT_TRUE(browser.wait_until("document.getElementById('status').textContent === 'succeeded' && "
                                 "document.getElementById('log').getAttribute('data-state') === 'ended' && "
                                 "!!document.getElementById('diff')",
                                 std::chrono::seconds(30)))
      << browser.error();
  std::string dom = browser.eval("document.documentElement.outerHTML")->get<std::string>();
  EXPECT_NE(dom.find("tool call: submit"), std::string::npos) << dom;
  EXPECT_NE(dom.find("<details class=\"tool-call\""), std::string::npos) << "tool calls are folded";
  EXPECT_NE(dom.find("<details class=\"tool-result\""), std::string::npos) << "tool results are folded";
  EXPECT_NE(dom.find("class=\"ev ev-reasoning reasoning\""), std::string::npos) << "reasoning is dimmed";
  EXPECT_NE(dom.find("released"), std::string::npos) << "the gate's output";
  EXPECT_NE(dom.find("(verified)"), std::string::npos) << dom;
  EXPECT_NE(dom.find("+echo $((1 + 1))"), std::string::npos) << "the diff is shown";

  std::filesystem::path out_dir = std::filesystem::path(KILN_BINARY_DIR) / "test-output";
  std::filesystem::create_directories(out_dir);
  std::filesystem::path shot = out_dir / "web_build_page.png";
  std::filesystem::remove(shot);
  ASSERT_TRUE(browser.screenshot(shot)) << browser.error();
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

// A failed build's page says why: the message under the title and in the final status line.
TEST(Web, FailedBuildPageShowsWhy) {
  testing::TempDir dir;
  testing::ServerFixture f(testing::test_config(dir));
  auto b = f.store().submit(testing::spec_for("doomed task", "test-model"));
  ASSERT_TRUE(b.ok());
  int attempt = testing::claim_build(f.store(), b->id);
  store::FinishRequest fin;
  fin.status = store::BuildStatus::error;
  fin.reason = store::OutcomeReason::model_error;
  fin.error_message = "model failed to load: no config.json";
  ASSERT_TRUE(f.store().finish(b->id, attempt, fin).ok());
  std::string page = run_chromium((dir.path() / "p").string(), "--dump-dom --virtual-time-budget=5000",
                                  f.url() + "/#/build/" + std::to_string(b->id));
  EXPECT_NE(page.find("<p id=\"error\" class=\"error\">model failed to load: no config.json</p>"), std::string::npos)
      << page;
  EXPECT_NE(page.find("error (model_error): model failed to load: no config.json"), std::string::npos) << page;
}

}  // namespace
}  // namespace kiln::server
