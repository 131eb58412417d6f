// kiln serve's configuration file: the fields this server added (leases, memory budget, idle
// unloading, scripted test models) parse, and mistakes are errors naming the field.
#include "server/config.h"

#include <gtest/gtest.h>

namespace kiln::server {
namespace {

std::string parse_error(const std::string& text) {
  ServerConfig c;
  auto err = parse_config_json(text, c);
  return err ? *err : "";
}

TEST(Config, LeaseMemoryBudgetAndIdleUnloading) {
  ServerConfig c;
  ASSERT_EQ(parse_config_json(R"({"lease_seconds": 5, "memory_budget": "2GiB",
      "models": [{"name": "m", "path": "/models/m", "idle_unload_seconds": 600}]})", c), std::nullopt);
  EXPECT_EQ(c.lease_seconds, 5);
  EXPECT_EQ(c.memory_budget_bytes, 2ull << 30);
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].idle_unload_seconds, 600);
  EXPECT_TRUE(c.models[0].scripted_test_turns.empty());

  ServerConfig defaults;
  EXPECT_EQ(defaults.lease_seconds, 30);
  EXPECT_EQ(defaults.memory_budget_bytes, 0u);
  EXPECT_EQ(parse_error(R"({"lease_seconds": 0})"), "lease_seconds: expected an integer from 1 to 2147483647");
  // Default limits above the store's bounds would make every build without limits a 400.
  EXPECT_EQ(parse_error(R"({"limits": {"wall_seconds": 10000000000}})"),
            "limits.wall_seconds: expected an integer from 1 to 10000000");
  EXPECT_NE(parse_error(R"({"memory_budget": "lots"})").find("memory_budget"), std::string::npos);
  EXPECT_EQ(c.models[0].draft_tokens, 8);  // speculative decoding on by default
  ServerConfig off;
  ASSERT_EQ(parse_config_json(R"({"models": [{"name": "m", "path": "p", "draft_tokens": 0}]})", off), std::nullopt);
  EXPECT_EQ(off.models[0].draft_tokens, 0);
  EXPECT_EQ(parse_error(R"({"models": [{"name": "m", "path": "p", "draft_tokens": 17}]})"),
            "models[0].draft_tokens: expected an integer from 0 to 16");
  EXPECT_NE(parse_error(R"({"models": [{"name": "m", "path": "p", "idle_unload_seconds": -1}]})")
                .find("models[0].idle_unload_seconds"),
            std::string::npos);
}

// Values that used to slip through: integers past their type (4294967297 workers became 1), NaN
// sizes, pings slower than clients wait; and errors that now say where.
TEST(Config, OutOfRangeValuesAreErrorsAndVarDirMovesTheDatabase) {
  EXPECT_EQ(parse_error(R"({"workers": 4294967297})"), "workers: expected an integer from 0 to 2147483647");
  EXPECT_EQ(parse_error(R"({"workers": 18446744073709551615})"), "workers: expected an integer from 0 to 2147483647");
  EXPECT_NE(parse_error(R"({"max_body_bytes": "nan"})").find("max_body_bytes"), std::string::npos);
  EXPECT_NE(parse_error(R"({"max_body_bytes": "20000000000000000000B"})").find("max_body_bytes"), std::string::npos);
  EXPECT_EQ(parse_error(R"({"sse_ping_seconds": 60})"), "sse_ping_seconds: expected an integer from 1 to 30");
  const std::string bad_json = parse_error("{\n  \"workers\": 2,\n  oops\n}");
  EXPECT_NE(bad_json.find("not valid JSON"), std::string::npos) << bad_json;
  EXPECT_NE(bad_json.find("line 3"), std::string::npos) << bad_json;

  ServerConfig c;
  ASSERT_EQ(parse_config_json(R"({"var_dir": "/srv/kiln"})", c), std::nullopt);
  EXPECT_EQ(c.db_path, "/srv/kiln/kiln.db");
  ServerConfig both;
  ASSERT_EQ(parse_config_json(R"({"var_dir": "/srv/kiln", "db": "/data/k.db"})", both), std::nullopt);
  EXPECT_EQ(both.db_path, "/data/k.db");
  ServerConfig dir;
  EXPECT_NE(load_config_file("/tmp", dir).value_or("").find("is a directory"), std::string::npos);
}

TEST(Config, ModelsServeQuantizedWeightsUnlessTold) {
  ServerConfig c;
  ASSERT_EQ(parse_config_json(R"({"models": [{"name": "a", "path": "/m/a"},
      {"name": "b", "path": "/m/b", "weights": "stored", "cache_dtype": "bf16"}]})", c), std::nullopt);
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].weights, "q8");  // issue 9: q8 is the CPU serving default
  EXPECT_EQ(c.models[0].cache_dtype, "f32");
  EXPECT_EQ(c.models[1].weights, "stored");
  EXPECT_EQ(c.models[1].cache_dtype, "bf16");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "m", "path": "p", "weights": "q3"}]})"),
            "models[0].weights: expected stored, bf16, q8 or q4");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "m", "path": "p", "cache_dtype": "f16"}]})"),
            "models[0].cache_dtype: expected f32 or bf16");
}

TEST(Config, ScriptedTestModelNeedsNoPathAndItsTurnsAreChecked) {
  ServerConfig c;
  ASSERT_EQ(parse_config_json(R"({"models": [{"name": "scripted-test", "scripted_test_turns": [
      {"reasoning": "look", "decode_ms_per_token": 3, "calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
      {"calls": [{"name": "submit", "arguments": {"summary": "ok"}}]}]}]})", c), std::nullopt);
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_TRUE(c.models[0].path.empty());
  EXPECT_NE(c.models[0].scripted_test_turns.find("\"bash\""), std::string::npos);

  EXPECT_EQ(parse_error(R"({"models": [{"name": "s", "scripted_test_turns": []}]})"),
            "models[0].scripted_test_turns: expected a non-empty array of turns");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "s", "scripted_test_turns": [{"calls": [{"arguments": {}}]}]}]})"),
            "models[0].scripted_test_turns[0].calls[0].name: required, a tool name");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "s", "scripted_test_turns": [{"txt": "typo"}]}]})"),
            "models[0].scripted_test_turns[0].txt: unknown field");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "s", "scripted_test_turns": [{"calls": [{"name": "x", "arguments": 3}]}]}]})"),
            "models[0].scripted_test_turns[0].calls[0].arguments: expected an object");
  EXPECT_EQ(parse_error(R"({"models": [{"name": "m"}]})"), "models[0].path: required, a model directory");
}

}  // namespace
}  // namespace kiln::server
