// ModelHost with two real (tiny, random-weight) engine models: load on first use, unload the
// least recently used idle model when memory is short, unload after an idle timeout, and what
// /v1/models says about each.
#include "server/model_host.h"

#include <gtest/gtest.h>

#include <sstream>

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
  }
  EXPECT_EQ(host.state("tiny-a").in_use, 0);
  EXPECT_TRUE(host.state("tiny-a").loaded);  // idle, but memory is not short yet

  {
    auto chat_b = host.open("tiny-b", 2);  // does not fit next to A: A (idle) is unloaded
    ASSERT_TRUE(chat_b.ok()) << chat_b.error();
    EXPECT_FALSE(host.state("tiny-a").loaded);
    EXPECT_EQ(host.state("tiny-a").unloads, 1);
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

}  // namespace
}  // namespace kiln::server
