// Bad input: a typed error naming the field, and nothing written.
#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

struct BadCase {
  const char* name;
  std::function<void(BuildSpec&)> spoil;
  const char* field;
};

TEST(StoreValidation, BadSpecsNameTheFieldAndWriteNothing) {
  TempDir dir;
  StoreOptions options;
  options.path = dir.file("kiln.db");
  options.allowed_models = std::set<std::string>{"qwen-a", "qwen-b"};
  auto store = std::move(*Store::open(options));
  const BadCase cases[] = {
      {"empty task", [](BuildSpec& s) { s.task = ""; }, "task"},
      {"blank task", [](BuildSpec& s) { s.task = " \n\t"; }, "task"},
      {"unknown model", [](BuildSpec& s) { s.model = "gpt-17"; }, "model"},
      {"empty model", [](BuildSpec& s) { s.model = ""; }, "model"},
      {"empty repo", [](BuildSpec& s) { s.repo = ""; }, "repo"},
      {"relative repo path", [](BuildSpec& s) { s.repo = "projects/app"; }, "repo"},
      {"dot-relative repo path", [](BuildSpec& s) { s.repo = "./app"; }, "repo"},
      {"empty verify", [](BuildSpec& s) { s.verify = " "; }, "verify"},
      {"negative steps", [](BuildSpec& s) { s.limits.max_steps = -1; }, "limits.max_steps"},
      {"negative tokens", [](BuildSpec& s) { s.limits.max_tokens = -5; }, "limits.max_tokens"},
      {"negative wall", [](BuildSpec& s) { s.limits.max_wall_s = -60; }, "limits.max_wall_s"},
      // Past these the worker's int step count and steady_clock deadline overflow.
      {"huge steps", [](BuildSpec& s) { s.limits.max_steps = 3'000'000'000; }, "limits.max_steps"},
      {"steps just over", [](BuildSpec& s) { s.limits.max_steps = 1'000'001; }, "limits.max_steps"},
      {"huge tokens", [](BuildSpec& s) { s.limits.max_tokens = 10'000'000'000; }, "limits.max_tokens"},
      {"huge wall", [](BuildSpec& s) { s.limits.max_wall_s = 10'000'000'000; }, "limits.max_wall_s"},
  };
  for (const BadCase& c : cases) {
    BuildSpec s = spec();
    c.spoil(s);
    Result<Build> r = store->submit(s);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument) << c.name;
    EXPECT_EQ(r.error().field, c.field) << c.name;
    EXPECT_FALSE(r.error().message.empty()) << c.name;
  }
  Result<Build> unknown = store->submit(spec("t", "gpt-17"));
  EXPECT_NE(unknown.error().message.find("qwen-a, qwen-b"), std::string::npos) << unknown.error().message;

  Result<StoreStats> stats = store->stats();
  ASSERT_OK(stats);
  for (const auto& [status, count] : stats->builds_by_status) EXPECT_EQ(count, 0);
  ListQuery all;
  EXPECT_TRUE(store->list(all)->builds.empty());
  // A good spec still goes in, and gets id 1: the failed ones did not even consume ids.
  Result<Build> good = store->submit(spec());
  ASSERT_OK(good);
  EXPECT_EQ(good->id, 1);
  BuildSpec at_bounds = spec("at the bounds");
  at_bounds.limits = {kMaxLimitSteps, kMaxLimitTokens, kMaxLimitWallSeconds};
  ASSERT_OK(store->submit(at_bounds));
}

TEST(StoreValidation, BadClaimAndOpenOptionsNameTheField) {
  TempDir dir;
  auto store = open_store(dir.file("kiln.db"));
  EXPECT_EQ(store->claim(claimer("")).error().field, "owner");
  EXPECT_EQ(store->claim(claimer("w", 0)).error().field, "lease_ms");
  StoreOptions bad;
  bad.path = dir.file("other.db");
  bad.max_attempts = 0;
  EXPECT_EQ(Store::open(bad).error().field, "max_attempts");
  bad.max_attempts = 3;
  bad.path = ":memory:";
  EXPECT_EQ(Store::open(bad).error().field, "path");
}

TEST(StoreValidation, EnumNamesRoundTrip) {
  for (BuildStatus s : kAllStatuses) EXPECT_EQ(parse_build_status(to_string(s)), s);
  for (int i = 0; i <= static_cast<int>(OutcomeReason::model_error); ++i) {
    auto r = static_cast<OutcomeReason>(i);
    EXPECT_EQ(parse_outcome_reason(to_string(r)), r);
  }
  EXPECT_FALSE(parse_build_status("done"));
  EXPECT_FALSE(parse_outcome_reason(""));
}

}  // namespace
}  // namespace kiln::store
