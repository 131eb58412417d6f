// The decode-step kernels the batched forward pass runs per sequence, against their plain twins:
// the AVX2 recurrent delta rule (gated_delta_rule_decode) against gated_delta_rule_recurrent, over
// several tokens (the state carries), head sizes with and without a multiple-of-4 tail, and with
// and without a thread pool; attention read in place from scattered KV pages (f32 and bf16)
// against attention_ref over the same keys and values.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <numeric>
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

struct AttnCase {
  int64_t T, n_kv, page_tokens;
  int Hq, Hkv, D;
  bool bf16;
};

class PagedAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(PagedAttention, MatchesContiguousReference) {
  const AttnCase c = GetParam();
  const int64_t row = int64_t(c.Hkv) * c.D, pages = (c.n_kv + c.page_tokens - 1) / c.page_tokens;
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> q(size_t(c.T * c.Hq * c.D)), k(size_t(c.n_kv * row)), v(k.size());
  for (auto& x : q) x = n01(rng);
  for (auto& x : k) x = n01(rng);
  for (auto& x : v) x = n01(rng);
  const size_t elt = c.bf16 ? 2 : 4;
  if (c.bf16)  // the reference sees exactly what the cache holds
    for (auto* buf : {&k, &v})
      for (auto& x : *buf) {
        const uint16_t b = f32_to_bf16(x);
        to_f32(Dtype::bf16, &b, &x, 1);
      }
  // Pages in shuffled order, as a pool hands them out.
  std::vector<int> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<uint8_t>> kmem(static_cast<size_t>(pages)), vmem(static_cast<size_t>(pages));
  std::vector<const uint8_t*> kp(static_cast<size_t>(pages)), vp(static_cast<size_t>(pages));
  for (int64_t p = 0; p < pages; ++p) {
    const int slot = order[size_t(p)];
    kmem[size_t(slot)].assign(size_t(c.page_tokens * row) * elt, 0);
    vmem[size_t(slot)].assign(size_t(c.page_tokens * row) * elt, 0);
    for (int64_t j = 0; j < c.page_tokens && p * c.page_tokens + j < c.n_kv; ++j)
      for (int64_t e = 0; e < row; ++e) {
        const size_t src = size_t((p * c.page_tokens + j) * row + e), dst = size_t(j * row + e);
        if (c.bf16) {
          reinterpret_cast<uint16_t*>(kmem[size_t(slot)].data())[dst] = f32_to_bf16(k[src]);
          reinterpret_cast<uint16_t*>(vmem[size_t(slot)].data())[dst] = f32_to_bf16(v[src]);
        } else {
          std::memcpy(kmem[size_t(slot)].data() + dst * 4, &k[src], 4);
          std::memcpy(vmem[size_t(slot)].data() + dst * 4, &v[src], 4);
        }
      }
    kp[size_t(p)] = kmem[size_t(slot)].data(), vp[size_t(p)] = vmem[size_t(slot)].data();
  }
  const float scale = 1.0f / std::sqrt(float(c.D));
  std::vector<float> ref(q.size()), got(q.size());
  ops::attention_ref(q.data(), k.data(), v.data(), c.T, c.n_kv, c.Hq, c.Hkv, c.D, scale, ref.data());
  ThreadPool pool(2);
  const ops::PagedKv view{kp.data(), vp.data(), c.page_tokens, row, c.bf16};
  ops::attention_paged(&pool, q.data(), view, c.T, c.n_kv, c.Hq, c.Hkv, c.D, scale, got.data());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, PagedAttention,
                         ::testing::Values(AttnCase{1, 1, 16, 4, 2, 32, false}, AttnCase{1, 100, 16, 4, 2, 32, false},
                                           AttnCase{1, 257, 16, 8, 2, 64, true}, AttnCase{3, 50, 7, 6, 3, 16, false},
                                           AttnCase{5, 64, 16, 4, 4, 8, true},
                                           // the real family's shape: 8 query heads per KV head,
                                           // head size 256, three 512-key splits
                                           AttnCase{1, 1100, 16, 16, 2, 256, false},
                                           // groups of 3 and 6 (row tiles of 4 + 2), pages longer
                                           // than the value kernel's 64 keys
                                           AttnCase{2, 300, 80, 6, 2, 32, true}, AttnCase{1, 40, 16, 6, 1, 16, false}));

}  // namespace
}  // namespace kiln::engine
