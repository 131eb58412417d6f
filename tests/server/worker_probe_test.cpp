// The worker pool `kiln serve` starts probes the sandbox first: on a host where bubblewrap is
// unusable it says why, and builds end with infra_error naming the reason (instead of running
// commands unsandboxed or failing obscurely). Here bwrap is pointed at a path that does not exist.
#include <gtest/gtest.h>

#include <thread>

#include "agent/scripted_chat_model.h"
#include "agent/worker_pool.h"
#include "test_server.h"

namespace kiln::server {
namespace {

TEST(WorkerProbe, UnusableSandboxEndsBuildsWithInfraErrorNamingWhy) {
  testing::TempDir dir;
  store::StoreOptions store_options;
  store_options.path = (dir.path() / "kiln.db").string();
  auto opened = store::Store::open(store_options);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  store::Store& s = *opened.value();
  auto build = s.submit(testing::spec_for("anything", "scripted"));
  ASSERT_TRUE(build.ok());

  agent::WorkerOptions options;
  options.workspace_root = dir.path() / "workspaces";
  options.sandbox.bwrap_path = dir.path() / "no-such-bwrap";
  options.heartbeat_interval = std::chrono::milliseconds(50);
  bool model_opened = false;
  agent::ModelProvider provider = [&](const std::string&, int64_t) -> agent::Result<std::unique_ptr<agent::ChatModel>> {
    model_opened = true;
    return std::unique_ptr<agent::ChatModel>(std::make_unique<agent::ScriptedChatModel>(std::vector<agent::ScriptedTurn>{}));
  };
  int64_t unusable_before = agent::sandbox_failure_counts()["unusable"];
  agent::WorkerPool pool(options, s, provider, 1);
  pool.start();
  EXPECT_EQ(pool.sandbox_unusable(), "bwrap not found");

  store::Build b;
  for (int i = 0; i < 200; ++i) {
    b = *s.get(build->id);
    if (store::is_terminal(b.status)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  pool.stop();
  EXPECT_EQ(b.status, store::BuildStatus::error);
  ASSERT_TRUE(b.outcome.has_value());
  EXPECT_EQ(*b.outcome, store::OutcomeReason::infra_error);
  ASSERT_TRUE(b.error_message.has_value());
  EXPECT_EQ(*b.error_message, "the sandbox is unusable on this host: bwrap not found");
  EXPECT_FALSE(model_opened) << "nothing runs without a sandbox";
  EXPECT_EQ(agent::sandbox_failure_counts()["unusable"] - unusable_before, 1);
}

}  // namespace
}  // namespace kiln::server
