// `kiln sandbox probe|run` end to end, through the real kiln binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "sandbox/temp_workspace.h"

namespace {

struct Ran {
  int exit_code;
  std::string out;
};

Ran kiln(const std::string& args) {
  const char* env = std::getenv("KILN_BIN");
  std::string bin = env != nullptr ? env : KILN_BINARY_DIR "/bin/kiln";
  std::string out;
  FILE* pipe = popen((bin + " " + args + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(SandboxCli, RunPrintsTheResultAsJson) {
  kiln::testing::TempWorkspace ws;
  Ran r = kiln("sandbox run --workspace " + ws.path().string() + " --timeout 3 -- sh -c 'echo hi; printf \"\\377\"; exit 3'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["timed_out"], false);
  EXPECT_EQ(j["output"], "hi\n\xEF\xBF\xBD");  // the invalid byte became U+FFFD
  EXPECT_EQ(j["enforced"][0], "bwrap");
}

TEST(SandboxCli, RunTimesOut) {
  kiln::testing::TempWorkspace ws;
  Ran r = kiln("sandbox run --workspace " + ws.path().string() + " --timeout 0.5 -- sleep 10");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["timed_out"], true);
}

TEST(SandboxCli, RunWithoutWorkspaceIsAUsageError) {
  Ran r = kiln("sandbox run -- true");
  EXPECT_EQ(r.exit_code, 2);
}

TEST(SandboxCli, ProbeJsonSaysUsable) {
  Ran r = kiln("sandbox probe --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["usable"], true);
  EXPECT_GE(j["layers"].size(), 8u);
}

}  // namespace
