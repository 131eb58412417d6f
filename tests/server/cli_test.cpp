// The kiln command line: parsing, help, usage errors, and the client commands (submit --follow,
// logs, builds, cancel, compare --since) against a running server.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "server/cli/cli.h"
#include "test_server.h"

namespace {

struct CliResult {
  int exit_code;
  std::string out;
  std::string err;
};

CliResult run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln");
  std::ostringstream out, err;
  int code = kiln::cli::run(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(Cli, UnknownSubcommandExitsTwoAndNamesIt) {
  CliResult r = run_cli({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos) << r.err;
}

TEST(Cli, NoSubcommandIsAUsageError) {
  CliResult r = run_cli({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(r.err.empty());
}

TEST(Cli, HelpListsEverySubcommand) {
  CliResult r = run_cli({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"serve", "submit", "logs", "builds", "cancel", "compare", "engine", "sandbox"}) {
    EXPECT_NE(r.out.find(cmd), std::string::npos) << "missing " << cmd << " in:\n" << r.out;
  }
}

TEST(Cli, SubcommandHelpListsItsOptions) {
  CliResult r = run_cli({"serve", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--listen"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--db"), std::string::npos) << r.out;
}

TEST(Cli, EngineHelpListsVerbs) {
  CliResult r = run_cli({"engine", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("make-tiny"), std::string::npos) << r.out;
}

TEST(Cli, UnknownEngineVerbExitsTwoAndNamesIt) {
  CliResult r = run_cli({"engine", "transmogrify"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("transmogrify"), std::string::npos) << r.err;
}

TEST(Cli, NonFiniteSamplingValuesAreUsageErrors) {
  for (const char* value : {"nan", "inf"}) {
    CliResult r = run_cli({"engine", "generate", "--model", "/nonexistent", "--prompt", "hi", "--temperature", value});
    EXPECT_EQ(r.exit_code, 2) << value;
    EXPECT_NE(r.err.find("must be a finite number, got " + std::string(value)), std::string::npos) << r.err;
  }
}

// Token ids were parsed as long and cast to int32: 4294967297 became token 1.
TEST(Cli, EngineTokenIdsOutsideInt32AreRefusedNotWrapped) {
  for (const char* ids : {"1,4294967297", "-1", "2147483648"}) {
    CliResult r = run_cli({"engine", "generate", "--model", "/nonexistent", "--tokens", ids});
    EXPECT_EQ(r.exit_code, 1) << ids;
    EXPECT_NE(r.err.find("is not a token id"), std::string::npos) << r.err;
    r = run_cli({"engine", "logits", "--model", "/nonexistent", "--tokens", ids});
    EXPECT_EQ(r.exit_code, 1) << ids;
    EXPECT_NE(r.err.find("is not a token id"), std::string::npos) << r.err;
  }
}

TEST(Cli, UnknownOptionIsAUsageError) {
  CliResult r = run_cli({"serve", "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST(Cli, ServeRejectsMalformedListenAddress) {
  CliResult r = run_cli({"serve", "--listen", "localhost"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--listen"), std::string::npos) << r.err;
}

// A configured model directory that does not exist is reported at start, naming the field, not
// by every build that later asks for it.
TEST(Cli, ServeRefusesAModelDirectoryWithoutConfigJson) {
  kiln::server::testing::TempDir dir;
  const auto config = dir.path() / "kiln.json";
  std::ofstream(config) << R"({"models": [{"name": "gone", "path": "/nonexistent/model"}]})";
  CliResult r = run_cli({"serve", "--config", config.string(), "--db", (dir.path() / "k.db").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("models[0].path: no config.json in '/nonexistent/model'"), std::string::npos) << r.err;
}

// A KV budget that leaves each session far less than an agent build's context is said at start
// (here the released 35B-A3B's config with the 1 GiB default for 4 sessions); the server then
// fails to open its database (a directory), which ends the command.
TEST(Cli, ServeWarnsWhenTheKvBudgetIsSmallForAgentBuilds) {
  kiln::server::testing::TempDir dir;
  std::filesystem::create_directories(dir.path() / "model");
  std::filesystem::copy_file(std::filesystem::path(KILN_SOURCE_DIR) / "examples/models/qwen3.6-35b-a3b.config.json",
                             dir.path() / "model" / "config.json");
  const auto config = dir.path() / "kiln.json";
  std::ofstream(config) << R"({"models": [{"name": "big", "kv_budget": "1GiB", "path": ")" << (dir.path() / "model").string()
                         << R"("}]})";
  CliResult r = run_cli({"serve", "--config", config.string(), "--db", dir.path().string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("KV budget is small for agent builds"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model=big"), std::string::npos) << r.err;
}

// The client commands against a server whose real workers run the scripted test model.
TEST(Cli, SubmitFollowLogsBuildsAndCancelAgainstALiveServer) {
  namespace t = kiln::server::testing;
  t::TempDir dir;
  t::make_git_repo(dir.path() / "repo");
  std::string gate = "if [ -e /workspace/.kiln/hold ]; then sleep 60; fi; echo free";
  t::ServerFixture f(t::live_config(dir, t::scripted_turns_json(2, 20, gate)));
  std::string repo = (dir.path() / "repo").string();

  CliResult done = run_cli({"submit", "--server", f.url(), "--repo", repo, "--task", "make calc.sh add", "--verify",
                            "test \"$(bash calc.sh)\" = 2", "--follow"});
  EXPECT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.out.rfind("1\n", 0), 0u) << done.out;  // the id first
  EXPECT_NE(done.out.find("tool_call bash {\"command\":\"echo step-1"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("tool_call submit"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("status succeeded"), std::string::npos) << done.out;

  CliResult listed = run_cli({"builds", "--server", f.url(), "--status", "succeeded"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("verified"), std::string::npos) << listed.out;
  CliResult logs = run_cli({"logs", "1", "--server", f.url()});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_EQ(logs.out.rfind("[1] status queued\n[2] status running\n", 0), 0u) << logs.out;

  // A build held in its last command: cancel it; following its log ends with exit code 1.
  CliResult held = run_cli({"submit", "--server", f.url(), "--repo", repo, "--task", "wait for me"});
  ASSERT_EQ(held.exit_code, 0) << held.err;
  ASSERT_EQ(held.out, "2\n");
  std::filesystem::path hold = dir.path() / "workspaces" / "build-2" / ".kiln" / "hold";
  for (int i = 0; i < 400 && !std::filesystem::exists(hold.parent_path()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::ofstream(hold) << "hold\n";  // before the scripted model gets to its last command
  CliResult cancel = run_cli({"cancel", "2", "--server", f.url()});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  CliResult followed = run_cli({"logs", "2", "--follow", "--server", f.url()});
  EXPECT_EQ(followed.exit_code, 1);
  EXPECT_NE(followed.out.find("status cancelled"), std::string::npos) << followed.out;
  EXPECT_NE(followed.out.find("build 2 cancelled (cancelled)"), std::string::npos) << followed.out;

  // A relative --repo is the caller's directory, not the server's.
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  CliResult relative = run_cli({"submit", "--server", f.url(), "--repo", "repo", "--task", "relative"});
  std::filesystem::current_path(cwd);
  ASSERT_EQ(relative.exit_code, 0) << relative.err;
  EXPECT_EQ(f.store().get(3)->spec.repo, repo);
}

TEST(Cli, EventLinesForTheLog) {
  using nlohmann::json;
  using kiln::server::format_event_line;
  EXPECT_EQ(format_event_line({{"seq", 1}, {"kind", "status"}, {"payload", {{"status", "queued"}, {"attempt", 0}}}}),
            "[1] status queued");
  EXPECT_EQ(format_event_line({{"seq", 4}, {"kind", "status"},
                               {"payload", {{"phase", "waiting_for_engine"}, {"position", 2}, {"max_sessions", 4}}}}),
            "[4] status phase waiting_for_engine (place 2 in line)");
  EXPECT_EQ(format_event_line({{"seq", 7}, {"kind", "tool_call"},
                               {"payload", {{"name", "bash"}, {"arguments", {{"command", "ls"}}}}}}),
            "[7] tool_call bash {\"command\":\"ls\"}");
  EXPECT_EQ(format_event_line({{"seq", 8}, {"kind", "tool_result"}, {"payload", {{"output", "[exit code 0]"}}}}),
            "[8] tool_result [exit code 0]");
  // The final status says why a build failed.
  EXPECT_EQ(format_event_line({{"seq", 6}, {"kind", "status"},
                               {"payload", {{"status", "error"}, {"attempt", 1}, {"outcome", "model_error"},
                                            {"error_message", "model failed to load: no config.json"}}}}),
            "[6] status error (model_error): model failed to load: no config.json");
  // Model and command output cannot drive the terminal: escape sequences (C0 ESC, C1 CSI) are shown.
  EXPECT_EQ(format_event_line({{"seq", 9}, {"kind", "model_text"}, {"payload", {{"text", "\x1b]0;pwned\x07\x1b[2Jok\xc2\x9b" "1m\n\tnext"}}}}),
            "[9] model_text \\x1b]0;pwned\\x07\\x1b[2Jok\\x9b1m\n\tnext");
  // Cut on a character boundary: "é" is two bytes.
  EXPECT_EQ(kiln::server::cut_utf8("aé", 2), "a");
}

TEST(Cli, CompareSinceAgainstARunningServer) {
  kiln::server::testing::TempDir dir;
  kiln::server::testing::ServerFixture f(kiln::server::testing::test_config(dir));
  for (const char* model : {"test-model", "other-model"}) {
    auto b = f.store().submit(kiln::server::testing::spec_for("shared task", model));
    ASSERT_TRUE(b.ok());
    int attempt = kiln::server::testing::claim_build(f.store(), b->id);
    kiln::store::FinishRequest fin;
    fin.status = kiln::store::BuildStatus::succeeded;
    fin.reason = kiln::store::OutcomeReason::no_verify;
    ASSERT_TRUE(f.store().finish(b->id, attempt, fin).ok());
  }
  // An offset with '+' must survive the query string (the client percent-encodes it).
  CliResult all = run_cli({"compare", "--server", f.url(), "--models", "test-model,other-model", "--since",
                           "2000-01-01T01:00:00+01:00"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_NE(all.out.find("test-model"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("1 shared tasks"), std::string::npos) << all.out;
  CliResult none = run_cli({"compare", "--server", f.url(), "--models", "test-model", "--since", "4102444800"});
  ASSERT_EQ(none.exit_code, 0) << none.err;
  std::istringstream row(none.out.substr(none.out.find("\ntest-model") + 1));
  std::string name;
  int builds = -1;
  row >> name >> builds;
  EXPECT_EQ(builds, 0) << none.out;  // nothing finished since 2100
  CliResult bad = run_cli({"compare", "--server", f.url(), "--since", "last week"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("since"), std::string::npos) << bad.err;
}

}  // namespace
