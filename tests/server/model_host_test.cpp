// ModelHost with two real (tiny, random-weight) engine models: load on first use, unload the
// least recently used idle model when memory is short, unload after an idle timeout, and what
// /v1/models says about each.
#include "server/model_host.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/capacity.h"
#include "engine/make_tiny.h"
#include "server/models.h"
#include "test_server.h"

namespace kiln::server {
namespace {

using nlohmann::json;

struct TwoModels {
  testing::TempDir dir;
  ModelConfig a, b;
  TwoModels() {
    int seed = 1;
    for (ModelConfig* m : {&a, &b}) {
      m->name = m == &a ? "tiny-a" : "tiny-b";
      m->path = (dir.path() / m->name).string();
      m->kv_budget_bytes = 8ull << 20;
      m->max_sessions = 2;
      m->threads = 1;
      engine::TinyModelOptions options;
      options.seed = static_cast<uint64_t>(seed++);
      auto made = engine::make_tiny_model(m->path, options);
      EXPECT_TRUE(made.ok()) << made.error();
    }
  }
  uint64_t estimate(const ModelConfig& m) const { return model_memory_estimate(m); }
};

const json& model_entry(const json& doc, const std::string& name) {
  for (const json& m : doc["models"])
    if (m["name"] == name) return m;
  static const json none;
  ADD_FAILURE() << "no model " << name << " in " << doc;
  return none;
}

TEST(ModelHost, LoadsOnFirstUseAndEvictsTheLeastRecentlyUsedIdleModelWhenMemoryIsShort) {
  TwoModels t;
  ASSERT_GT(checkpoint_bytes(t.a.path), 0u);
  uint64_t budget = t.estimate(t.a) + t.estimate(t.b) - 1;  // room for one model, not both
  ModelRegistry registry({t.a, t.b});
  std::ostringstream log;
  ModelHost host({t.a, t.b}, budget, &registry, log);

  EXPECT_FALSE(host.state("tiny-a").loaded);  // nothing loads before it is used
  json doc = registry.describe(nullptr);
  EXPECT_FALSE(model_entry(doc, "tiny-a")["loaded"].get<bool>());
  EXPECT_EQ(model_entry(doc, "tiny-a")["residency"]["state"], "unloaded");

  {
    auto chat = host.open("tiny-a", 1);
    ASSERT_TRUE(chat.ok()) << chat.error();
    EXPECT_GT(chat.value()->context_limit(), 0);
    auto tokens = chat.value()->prompt_tokens(
        {agent::make_message(agent::Role::system, "You fix code."), agent::make_message(agent::Role::user, "hello")}, {});
    ASSERT_TRUE(tokens.ok()) << tokens.error();  // a working engine model behind it
    EXPECT_GT(*tokens, 0);
    EXPECT_TRUE(host.state("tiny-a").loaded);
    EXPECT_EQ(host.state("tiny-a").in_use, 1);
    doc = registry.describe(nullptr);
    EXPECT_TRUE(model_entry(doc, "tiny-a")["loaded"].get<bool>());
    EXPECT_EQ(model_entry(doc, "tiny-a")["residency"]["in_use"], 1);
    EXPECT_TRUE(model_entry(doc, "tiny-a")["capacity_plan"].is_object());
    // The engine's KV counters, read live while the model is loaded.
    std::atomic<bool> cancel{false};
    auto turn = chat.value()->next_turn({{agent::make_message(agent::Role::system, "You fix code."),
                                          agent::make_message(agent::Role::user, "hello")},
                                         {},
                                         2},
                                        nullptr, cancel);
    ASSERT_NE(turn.end, agent::TurnEnd::error) << turn.error;
    const json kv = model_entry(registry.describe(nullptr), "tiny-a")["kv"];
    ASSERT_TRUE(kv.is_object()) << kv;
    EXPECT_GT(kv["pages"].get<int64_t>(), 0);
    const int64_t page_tokens = kv["page_tokens"].get<int64_t>();
    EXPECT_EQ(kv["pages_in_use"].get<int64_t>(), (turn.usage.context_tokens + page_tokens - 1) / page_tokens);
    EXPECT_EQ(kv["preemptions"], 0);
    EXPECT_EQ(kv["refusals"], 0);
    EXPECT_EQ(registry.kv_stats().count("tiny-a"), 1u);
    EXPECT_TRUE(model_entry(doc, "tiny-b")["kv"].is_null());  // not loaded
  }
  EXPECT_EQ(host.state("tiny-a").in_use, 0);
  EXPECT_TRUE(host.state("tiny-a").loaded);  // idle, but memory is not short yet

  {
    auto chat_b = host.open("tiny-b", 2);  // does not fit next to A: A (idle) is unloaded
    ASSERT_TRUE(chat_b.ok()) << chat_b.error();
    EXPECT_FALSE(host.state("tiny-a").loaded);
    EXPECT_EQ(host.state("tiny-a").unloads, 1);
    EXPECT_EQ(registry.kv_stats().count("tiny-a"), 0u);  // its reader went before the model did
    EXPECT_TRUE(model_entry(registry.describe(nullptr), "tiny-a")["kv"].is_null());
    EXPECT_TRUE(host.state("tiny-b").loaded);
    EXPECT_LE(host.loaded_bytes(), budget);
    // B is in use, so A cannot come back: the build gets an error naming the budget.
    auto refused = host.open("tiny-a", 3);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().find("memory_budget"), std::string::npos) << refused.error();
    EXPECT_NE(refused.error().find("tiny-b"), std::string::npos) << refused.error();
    EXPECT_FALSE(host.state("tiny-a").loaded);
  }
  auto chat_a = host.open("tiny-a", 4);  // B is idle now: it makes room
  ASSERT_TRUE(chat_a.ok()) << chat_a.error();
  EXPECT_TRUE(host.state("tiny-a").loaded);
  EXPECT_EQ(host.state("tiny-a").loads, 2);
  EXPECT_FALSE(host.state("tiny-b").loaded);
  doc = registry.describe(nullptr);
  EXPECT_FALSE(model_entry(doc, "tiny-b")["loaded"].get<bool>());
  EXPECT_EQ(model_entry(doc, "tiny-b")["residency"]["state"], "unloaded");
  EXPECT_EQ(model_entry(doc, "tiny-b")["residency"]["unloads"], 1);
  EXPECT_NE(log.str().find("msg=\"model unloaded\" model=tiny-b reason=memory_budget"), std::string::npos) << log.str();
}

TEST(ModelHost, UnloadsAModelIdleLongerThanItsTimeoutAndNeverOneInUse) {
  TwoModels t;
  t.a.idle_unload_seconds = 5;  // B keeps the default 0: unloaded only when memory is short
  ModelRegistry registry({t.a, t.b});
  std::ostringstream log;
  ModelHost host({t.a, t.b}, 0, &registry, log);
  ASSERT_TRUE(host.open("tiny-a", 1).ok());
  ASSERT_TRUE(host.open("tiny-b", 2).ok());
  auto now = ModelHost::Clock::now();
  EXPECT_EQ(host.sweep(now), 0);  // just used
  EXPECT_EQ(host.sweep(now + std::chrono::seconds(6)), 1);
  EXPECT_FALSE(host.state("tiny-a").loaded);
  EXPECT_TRUE(host.state("tiny-b").loaded);
  EXPECT_EQ(model_entry(registry.describe(nullptr), "tiny-a")["residency"]["state"], "unloaded");

  auto held = host.open("tiny-a", 3);  // loads again on use
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(host.sweep(ModelHost::Clock::now() + std::chrono::hours(1)), 0);  // in use: stays
  EXPECT_TRUE(host.state("tiny-a").loaded);
}

TEST(ModelHost, AModelThatFailsToLoadGivesAnErrorAndShowsIt) {
  testing::TempDir dir;
  ModelConfig broken;
  broken.name = "broken";
  broken.path = (dir.path() / "nothing-here").string();
  ModelRegistry registry({broken});
  std::ostringstream log;
  ModelHost host({broken}, 0, &registry, log);
  auto r = host.open("broken", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("failed to load"), std::string::npos) << r.error();
  json entry = model_entry(registry.describe(nullptr), "broken");
  EXPECT_FALSE(entry["loaded"].get<bool>());
  EXPECT_NE(entry["residency"]["load_error"].get<std::string>().find("failed to load"), std::string::npos);
  EXPECT_FALSE(host.open("nope", 2).ok());
}

// A load that fails on a malformed file (a tokenizer.json whose model.type is a number: the JSON
// reader throws, and the loaders and ModelHost::open both turn that into an error) is that
// model's load error: the slot leaves `loading`, so the next open() answers instead of waiting.
TEST(ModelHost, ALoadThatThrowsIsAnErrorAndDoesNotLeaveTheModelLoading) {
  TwoModels t;
  const std::string tok = t.a.path + "/tokenizer.json";
  json j;
  {
    std::ifstream in(tok);
    j = json::parse(in);
  }
  j["model"]["type"] = 5;
  std::ofstream(tok, std::ios::trunc) << j.dump();
  ModelRegistry registry({t.a});
  std::ostringstream log;
  ModelHost host({t.a}, 0, &registry, log);
  for (int64_t build = 1; build <= 2; ++build) {
    agent::Result<std::unique_ptr<agent::ChatModel>> r = agent::Error{"not run"};
    ASSERT_NO_THROW(r = host.open("tiny-a", build));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().find("tokenizer.json: malformed"), std::string::npos) << r.error();
    EXPECT_FALSE(host.state("tiny-a").loaded);
  }
  EXPECT_EQ(model_entry(registry.describe(nullptr), "tiny-a")["residency"]["state"], "unloaded");
}


// kv_budget "auto" against the real 35B-A3B's layout (config only: no weights, so the weights
// leave all of usable memory).
struct BigModelConfig {
  testing::TempDir dir;
  ServerConfig config;
  engine::ModelConfig layout;
  BigModelConfig() {
    std::filesystem::create_directories(dir.path() / "big");
    std::filesystem::copy_file(std::filesystem::path(KILN_SOURCE_DIR) / "examples/models/qwen3.6-35b-a3b.config.json",
                               dir.path() / "big" / "config.json");
    ModelConfig m;
    m.name = "big";
    m.path = (dir.path() / "big").string();
    m.max_sessions = 4;
    config.models.push_back(m);
    layout = engine::load_model_config(m.path + "/config.json").value();
  }
  int64_t tokens_per_session() const {
    const ModelConfig& m = config.models[0];
    return engine::plan_capacity(layout, int64_t(m.kv_budget_bytes), m.max_sessions, engine::CacheDtype::f32, 16,
                                 m.draft_tokens)
               .kv_tokens /
           m.max_sessions;
  }
};

TEST(KvBudget, AutoGivesEverySessionRoomForAnAgentBuildWhenMemoryAllows) {
  BigModelConfig t;
  EXPECT_EQ(t.config.models[0].kv_budget_bytes, 0u);  // the default is "auto"
  std::ostringstream log;
  resolve_kv_budgets(t.config, int64_t(64) << 30, log);
  EXPECT_EQ(int64_t(t.config.models[0].kv_budget_bytes),
            engine::kv_budget_for(t.layout, 4, engine::CacheDtype::f32, kAutoKvTokensPerSession, 16,
                                  t.config.models[0].draft_tokens));
  EXPECT_EQ(t.config.models[0].draft_tokens, 8);  // the default: its scratch is in the budget
  EXPECT_EQ(t.tokens_per_session(), kAutoKvTokensPerSession);
  EXPECT_NE(log.str().find("tokens_per_session=65536"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("level=warn"), std::string::npos) << log.str();
}

TEST(KvBudget, AutoTakesAtMostHalfOfTheMemoryTheWeightsLeaveAndSaysWhatThatCosts) {
  BigModelConfig t;
  std::ostringstream log;
  resolve_kv_budgets(t.config, int64_t(8) << 30, log);
  EXPECT_EQ(t.config.models[0].kv_budget_bytes, 4ull << 30);
  EXPECT_LT(t.tokens_per_session(), kAgentContextTokens);
  EXPECT_NE(log.str().find("KV budget is small for agent builds"), std::string::npos) << log.str();

  BigModelConfig capped;  // and within memory_budget
  capped.config.memory_budget_bytes = 3ull << 30;
  resolve_kv_budgets(capped.config, int64_t(64) << 30, log);
  EXPECT_EQ(capped.config.models[0].kv_budget_bytes, 3ull << 30);
}

TEST(KvBudget, AnExplicitBudgetIsKeptAndWarnedAboutWhenSmall) {
  BigModelConfig t;
  t.config.models[0].kv_budget_bytes = 1ull << 30;
  std::ostringstream log;
  resolve_kv_budgets(t.config, int64_t(64) << 30, log);
  EXPECT_EQ(t.config.models[0].kv_budget_bytes, 1ull << 30);
  EXPECT_NE(log.str().find("KV budget is small for agent builds"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("model=big"), std::string::npos) << log.str();
}

TEST(KvBudget, ConfigSaysAutoOrASize) {
  ServerConfig c;
  ASSERT_FALSE(parse_config_json(R"({"models": [{"name": "m", "path": "/x", "kv_budget": "2GiB"}]})", c));
  EXPECT_EQ(c.models[0].kv_budget_bytes, 2ull << 30);
  ServerConfig a;
  ASSERT_FALSE(parse_config_json(R"({"models": [{"name": "m", "path": "/x", "kv_budget": "auto"}]})", a));
  EXPECT_EQ(a.models[0].kv_budget_bytes, 0u);
  ServerConfig bad;
  auto err = parse_config_json(R"({"models": [{"name": "m", "path": "/x", "kv_budget": "lots"}]})", bad);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("models[0].kv_budget"), std::string::npos) << *err;
  EXPECT_NE(err->find("\"auto\""), std::string::npos) << *err;
}

// The server and the engine CLI read sizes with one parser: the same spellings, the same refusals.
TEST(KvBudget, ByteSizesParseTheSameEverywhere) {
  for (const char* ok : {"36GiB", "512MiB", "2GB", "1000", "1.5g", "64k", "7B"}) {
    uint64_t bytes = 0;
    EXPECT_TRUE(parse_byte_size(ok, bytes)) << ok;
    EXPECT_EQ(int64_t(bytes), engine::parse_bytes(ok)) << ok;
  }
  EXPECT_EQ(engine::parse_bytes("1.5GiB"), int64_t(3) << 29);
  for (const char* bad : {"", "0", "0.1", "-5", "nan", "inf", "lots", "3 parsecs", "1.2.3GiB", "9999999999TiB", "GiB"}) {
    uint64_t bytes = 0;
    EXPECT_FALSE(parse_byte_size(bad, bytes)) << bad;
    EXPECT_EQ(engine::parse_bytes(bad), -1) << bad;
  }
}

}  // namespace
}  // namespace kiln::server
