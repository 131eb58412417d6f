// The correctness oracle: logits of the golden random-weight checkpoints against an independent
// float64 implementation (../shared/assets/golden/README.md), in prefill, decode and split modes,
// with the tolerances that README states.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace kiln::engine {
namespace {

using nlohmann::json;

const std::string kGolden = std::string(KILN_SHARED_DIR) + "/assets/golden/";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

double worst_rel_l2 = 0;  // reported after each test, to see the margin to the tolerance

// Checks one position's logits against the golden summary (and the full reference row when given).
void check_position(const std::string& what, const float* L, int64_t V, const json& ref, const json& tol,
                    const std::vector<double>* full) {
  const double sumsq_ref = ref["sumsq"].get<double>();
  const double rms = std::sqrt(sumsq_ref / double(V)), l2 = std::sqrt(sumsq_ref);
  double sum = 0, sumsq = 0, mx = -INFINITY;
  int64_t argmax = 0;
  for (int64_t i = 0; i < V; ++i) {
    sum += L[i], sumsq += double(L[i]) * L[i];
    if (L[i] > mx) mx = L[i], argmax = i;
  }
  double se = 0;
  for (int64_t i = 0; i < V; ++i) se += std::exp(double(L[i]) - mx);
  const double lse = mx + std::log(se);
  if (full) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double d = L[i] - (*full)[size_t(i)];
      num += d * d, den += (*full)[size_t(i)] * (*full)[size_t(i)];
    }
    const double rel = std::sqrt(num / den);
    worst_rel_l2 = std::max(worst_rel_l2, rel);
    EXPECT_LE(rel, tol["logits_rel_l2"].get<double>()) << what << ": relative L2";
  }
  for (const auto& top : ref["top"]) {
    const int64_t id = top[0].get<int64_t>();
    EXPECT_LE(std::abs(L[id] - top[1].get<double>()), tol["top_abs_over_rms"].get<double>() * rms)
        << what << ": top id " << id;
  }
  EXPECT_LE(std::abs(lse - ref["lse"].get<double>()), tol["lse_abs_over_rms"].get<double>() * rms) << what << ": lse";
  EXPECT_LE(std::abs(sumsq - sumsq_ref) / sumsq_ref, tol["sumsq_rel"].get<double>()) << what << ": sumsq";
  EXPECT_LE(std::abs(sum - ref["sum"].get<double>()) / l2, tol["sum_abs_over_l2"].get<double>()) << what << ": sum";
  const double gap = ref["top"][0][1].get<double>() - ref["top"][1][1].get<double>();
  if (gap > tol["argmax_min_gap_over_rms"].get<double>() * rms) {
    EXPECT_EQ(argmax, ref["argmax"].get<int64_t>()) << what << ": argmax";
  }
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = read_json(kGolden + GetParam() + ".golden.json");
    tokens_ = golden_["tokens"].get<std::vector<int32_t>>();
    auto m = Model::load(kGolden + GetParam(), EngineOptions{});
    ASSERT_TRUE(m.ok()) << m.error();
    model_ = std::move(m).value();
    V_ = model_->config().vocab_size;
    for (const auto& row : golden_["full_logits_prefill"]) full_.push_back(row.get<std::vector<double>>());
  }

  void TearDown() override {
    std::printf("  worst relative L2 vs the oracle: %.3g\n", worst_rel_l2);
    worst_rel_l2 = 0;
  }

  // Checks logits[T][V] for positions first.. against `summaries` (a list indexed by position).
  void check_rows(const std::string& mode, const std::vector<float>& logits, int64_t first, const json& summaries) {
    const int64_t T = int64_t(logits.size()) / V_;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = first + t;
      check_position(mode + " pos " + std::to_string(pos), &logits[size_t(t * V_)], V_, summaries[size_t(pos)],
                     golden_["tolerance"], &full_[size_t(pos)]);
    }
  }

  json golden_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<Model> model_;
  int64_t V_ = 0;
  std::vector<std::vector<double>> full_;
};

TEST_P(Golden, PrefillMatchesReferenceAtEveryPosition) {
  auto s = model_->open_session();
  ASSERT_TRUE(s.ok()) << s.error();
  auto logits = (*s)->append(tokens_, /*all_logits=*/true);
  ASSERT_TRUE(logits.ok()) << logits.error();
  check_rows("prefill", *logits, 0, golden_["prefill"]);
}

TEST_P(Golden, DecodeMatchesReferenceAtEveryPosition) {
  auto s = model_->open_session();
  ASSERT_TRUE(s.ok()) << s.error();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    auto logits = (*s)->append(std::span<const int32_t>(&tokens_[i], 1));
    ASSERT_TRUE(logits.ok()) << logits.error();
    check_rows("decode", *logits, int64_t(i), golden_["decode"]);
  }
}

TEST_P(Golden, SplitPrefillThenDecodeMatchesReference) {
  const int64_t n = golden_["split"]["prefill_tokens"].get<int64_t>();
  auto s = model_->open_session();
  ASSERT_TRUE(s.ok()) << s.error();
  auto logits = (*s)->append(std::span<const int32_t>(tokens_.data(), size_t(n)), true);
  ASSERT_TRUE(logits.ok()) << logits.error();
  check_rows("split", *logits, 0, golden_["split"]["positions"]);
  for (size_t i = size_t(n); i < tokens_.size(); ++i) {
    auto step = (*s)->append(std::span<const int32_t>(&tokens_[i], 1));
    ASSERT_TRUE(step.ok()) << step.error();
    check_rows("split", *step, int64_t(i), golden_["split"]["positions"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::Values("tiny-moe", "tiny-dense"));

}  // namespace
}  // namespace kiln::engine
