// The decode-step kernels the batched forward pass runs per sequence, against their plain twins:
// the AVX2 recurrent delta rule (gated_delta_rule_decode) against gated_delta_rule_recurrent, over
// several tokens (the state carries), head sizes with and without a multiple-of-4 tail, and with
// and without a thread pool.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/ops.h"

namespace kiln::engine {
namespace {

struct Shape {
  int Hk, Hv, dk, dv;
};

class DecodeRule : public ::testing::TestWithParam<Shape> {};

TEST_P(DecodeRule, MatchesTheRecurrentTwin) {
  const Shape s = GetParam();
  const int64_t T = 5, C = 2 * int64_t(s.Hk) * s.dk + int64_t(s.Hv) * s.dv;
  std::mt19937 rng(17);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> ch(size_t(T * C)), beta(size_t(T * s.Hv)), g(size_t(T * s.Hv));
  for (auto& x : ch) x = n01(rng) * 0.3f;
  for (auto& x : beta) x = ops::sigmoid(n01(rng));
  for (auto& x : g) x = -std::abs(n01(rng)) * 0.5f;
  std::vector<float> state0(size_t(s.Hv) * s.dk * s.dv);
  for (auto& x : state0) x = n01(rng) * 0.1f;
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> s_ref = state0, s_fast = state0, o_ref(size_t(T * s.Hv * s.dv)), o_fast(o_ref.size());
    for (int64_t t = 0; t < T; ++t) {  // one token per call, as decode steps do
      const float* c = &ch[size_t(t * C)];
      ops::DeltaRuleArgs a{1, s.Hk, s.Hv, s.dk, s.dv, c, c + s.Hk * s.dk, c + 2 * s.Hk * s.dk, C, C, C,
                           &beta[size_t(t * s.Hv)], &g[size_t(t * s.Hv)], s_ref.data(), &o_ref[size_t(t * s.Hv * s.dv)]};
      ops::gated_delta_rule_recurrent(nullptr, a);
      a.state = s_fast.data();
      a.out = &o_fast[size_t(t * s.Hv * s.dv)];
      ops::gated_delta_rule_decode(p, a);
    }
    double worst = 0;
    for (size_t i = 0; i < o_ref.size(); ++i) worst = std::max(worst, double(std::abs(o_ref[i] - o_fast[i])));
    for (size_t i = 0; i < s_ref.size(); ++i) worst = std::max(worst, double(std::abs(s_ref[i] - s_fast[i])));
    EXPECT_LE(worst, 1e-6) << "Hv=" << s.Hv << " dk=" << s.dk << " dv=" << s.dv;  // f32 rounding of the state only
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeRule,
                         ::testing::Values(Shape{2, 4, 16, 16}, Shape{3, 9, 8, 12}, Shape{1, 2, 128, 128},
                                           Shape{2, 2, 7, 13}));

}  // namespace
}  // namespace kiln::engine
