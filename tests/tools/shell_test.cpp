// The bash tool: exit codes, output shown to the model, saved full output, timeouts, cancellation.
#include <gtest/gtest.h>

#include <thread>

#include "tool_fixture.h"

namespace kiln::tools {
namespace {

using kiln::testing::ToolFixture;
using namespace std::chrono_literals;

TEST(Bash, ShowsExitCodeAndOutput) {
  ToolFixture f;
  ToolResult ok = f.call("bash", {{"command", "echo hi; ls"}});
  EXPECT_FALSE(ok.is_error);
  EXPECT_EQ(ok.text, "[exit code 0]\nhi\n");
  ToolResult bad = f.call("bash", {{"command", "echo oops >&2; exit 3"}});
  EXPECT_TRUE(bad.is_error);
  EXPECT_EQ(bad.text, "[exit code 3]\noops\n");
  EXPECT_EQ(bad.data["exit_code"], 3);
}

TEST(Bash, LongOutputIsCutForTheModelAndSavedWhole) {
  ToolFixture f;
  ToolResult r = f.call("bash", {{"command", "seq 1 100000"}});
  ASSERT_FALSE(r.is_error) << r.text.substr(0, 300);
  EXPECT_LT(r.text.size(), kShownOutputBytes + 200);
  EXPECT_EQ(r.text.rfind("[exit code 0]\n1\n2\n3\n", 0), 0u);
  EXPECT_NE(r.text.find("100000\n"), std::string::npos);
  EXPECT_NE(r.text.find("bytes cut; full output saved to /workspace/.kiln/outputs/1.log"), std::string::npos);
  std::string saved = f.ws.read(".kiln/outputs/1.log");
  std::string expected;
  for (int i = 1; i <= 100000; ++i) expected += std::to_string(i) + "\n";
  EXPECT_EQ(saved, expected);
  EXPECT_EQ(r.data["saved_output"], ".kiln/outputs/1.log");
}

// The sandbox owns .kiln/: a command can swap .kiln/outputs (or .kiln itself) for a link to a
// host directory. Saving the next long output must not write through it (kiln often runs as root):
// a linked outputs/ is refused, a linked .kiln is replaced by a real directory before the next
// command runs.
TEST(Bash, SavedOutputNeverFollowsALinkPlacedByACommand) {
  ToolFixture f;
  kiln::testing::TempWorkspace outside;
  for (const char* link : {".kiln/outputs", ".kiln"}) {
    ToolResult swap = f.call("bash", {{"command", std::string("rm -rf ") + link + " && ln -s " + outside.path().string() + " " + link}});
    ASSERT_FALSE(swap.is_error) << swap.text;
    ToolResult r = f.call("bash", {{"command", "seq 1 100000"}});
    EXPECT_NE(r.text.find("100000\n"), std::string::npos);  // the model still sees head and tail
    EXPECT_TRUE(std::filesystem::is_empty(outside.path())) << link;
    if (std::string(link) == ".kiln/outputs") {
      EXPECT_NE(r.text.find("could not save"), std::string::npos) << r.data.dump().substr(0, 600);
    } else {
      EXPECT_FALSE(std::filesystem::is_symlink(f.ws.path() / ".kiln"));
      EXPECT_EQ(r.data["saved_output"], ".kiln/outputs/2.log");
      EXPECT_EQ(f.ws.read(".kiln/outputs/2.log").size(), r.data["total_output_bytes"].get<size_t>());
    }
  }
}

TEST(Bash, TimeoutIsClampedToTheBuildLimit) {
  ToolFixture f;
  f.ctx.max_command_timeout = 700ms;
  auto start = std::chrono::steady_clock::now();
  ToolResult r = f.call("bash", {{"command", "sleep 20"}, {"timeout", 600}});
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("timed out"), std::string::npos) << r.text;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  EXPECT_TRUE(f.call("bash", {{"command", "true"}, {"timeout", 0}}).is_error);
  // A huge timeout is the build's limit, not an overflow into a negative one.
  ToolResult huge = f.call("bash", {{"command", "true"}, {"timeout", 10'000'000'000'000'000LL}});
  EXPECT_FALSE(huge.is_error) << huge.text;
  EXPECT_EQ(huge.data["timeout_seconds"], 0.7);
}

TEST(Bash, CancellationStopsTheCommandPromptly) {
  ToolFixture f;
  std::atomic<bool> cancel{false};
  f.ctx.cancel = &cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(400ms);
    cancel = true;
  });
  auto start = std::chrono::steady_clock::now();
  ToolResult r = f.call("bash", {{"command", "sleep 20"}});
  t.join();
  EXPECT_TRUE(r.is_error);
  EXPECT_NE(r.text.find("cancelled"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Bash, SandboxFailureIsAnInfraErrorNotAnExitCode) {
  ToolFixture f;
  f.ctx.policy.bwrap_path = "/nonexistent/bwrap";
  ToolResult r = f.call("bash", {{"command", "true"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.data["infra_error"], true);
  EXPECT_NE(r.text.find("bwrap not found"), std::string::npos);
}

}  // namespace
}  // namespace kiln::tools
