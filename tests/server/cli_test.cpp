// The kiln command line: parsing, help, and the error for an unknown subcommand.
#include <gtest/gtest.h>

#include <sstream>

#include "server/cli/cli.h"

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

}  // namespace
