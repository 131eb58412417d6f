// Fast ops against their plain twins on random inputs with realistic ranges.
#include <cmath>
#include <cstring>
#include <thread>
#include <tuple>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/ops.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::rel_l2;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  return testing::randn(n, g, scale);
}


// f32 accumulation of K ≤ 1000 products vs the f64 reference: ~1e-7 relative per element.
constexpr double kMatmulTol = 1e-6;

TEST(Ops, MatmulMatchesReferenceForEveryDtypeAndShape) {
  ThreadPool pool(3);
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::f16})
    for (auto [T, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 64}, {3, 130, 96}, {17, 8, 1000}, {64, 5, 7}}) {
      auto wf = randn(size_t(N * K), uint64_t(N * K));
      std::vector<uint8_t> raw(size_t(N * K) * dtype_size(dt));
      for (int64_t i = 0; i < N * K; ++i) {
        if (dt == Dtype::f32) std::memcpy(&raw[size_t(i) * 4], &wf[size_t(i)], 4);
        else {
          uint16_t h = dt == Dtype::bf16 ? f32_to_bf16(wf[size_t(i)]) : 0;
          if (dt == Dtype::f16) {  // f32 → f16 by search-free rounding through the decoder: use bf16 bits' range
            _Float16 f = _Float16(wf[size_t(i)]);
            std::memcpy(&h, &f, 2);
          }
          std::memcpy(&raw[size_t(i) * 2], &h, 2);
        }
      }
      Matrix w{raw.data(), dt, N, K};
      auto x = randn(size_t(T * K), 99);
      std::vector<float> y(size_t(T * N)), yr(size_t(T * N)), y1(size_t(T * N));
      ops::matmul(&pool, x.data(), T, w, y.data());
      ops::matmul(nullptr, x.data(), T, w, y1.data());
      ops::matmul_ref(x.data(), T, w, yr.data());
      EXPECT_LE(rel_l2(y, yr), kMatmulTol) << dtype_name(dt) << " T=" << T << " N=" << N << " K=" << K;
      EXPECT_EQ(y, y1) << "thread count changed the result";
    }
}

TEST(Ops, F16DecoderHandlesSubnormalsAndSpecials) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1e-6f}) {
    _Float16 h = _Float16(v);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    EXPECT_EQ(f16_to_f32(bits), float(h)) << v;
  }
}

TEST(Ops, AttentionMatchesReference) {
  ThreadPool pool(2);
  // Head sizes: 16 and 64 run the AVX2 tiled kernel (multiples of 16), 8 and 24 the portable one.
  for (const int D : {16, 8, 24, 64})
    for (auto [T, n_kv, Hq, Hkv] :
         {std::tuple<int64_t, int64_t, int, int>{1, 1, 2, 1}, {1, 40, 4, 2}, {9, 9, 6, 2}, {5, 30, 4, 4},
          // several query blocks (16 tokens) and key blocks (64 keys), partial at both ends,
          // with and without a cached prefix; an odd row count (3 tokens × 1 head)
          {37, 37, 8, 2}, {40, 200, 4, 1}, {70, 135, 2, 2}, {3, 130, 1, 1},
          // two query blocks of the AVX2 kernel (96 rows at group 1)
          {100, 150, 2, 2}}) {
      auto q = randn(size_t(T * Hq * D), 1), k = randn(size_t(n_kv * Hkv * D), 2), v = randn(size_t(n_kv * Hkv * D), 3);
      std::vector<float> o(q.size()), o1(q.size()), r(q.size());
      ops::attention(&pool, q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 0.25f, o.data());
      ops::attention(nullptr, q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 0.25f, o1.data());
      ops::attention_ref(q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 0.25f, r.data());
      EXPECT_LE(rel_l2(o, r), 1e-6) << "D=" << D << " T=" << T << " n_kv=" << n_kv;
      EXPECT_EQ(o, o1) << "the pool changed the result; D=" << D << " T=" << T << " n_kv=" << n_kv;
    }
}

// Softmax weights spanning the whole float range: scores far below a row's max underflow to
// exactly zero weight (never NaN), and a row whose first key block holds the max keeps its
// weights when later blocks are all far smaller (the running max never falls).
TEST(Ops, AttentionSurvivesExtremeScores) {
  ThreadPool pool(2);
  const int64_t T = 20, n_kv = 150;
  const int Hq = 2, Hkv = 1, D = 32;
  auto q = randn(size_t(T * Hq * D), 4), k = randn(size_t(n_kv * Hkv * D), 5), v = randn(size_t(n_kv * Hkv * D), 6);
  for (int64_t j = 0; j < n_kv; ++j)  // keys of very different lengths: scores from ~±1 to ~±1e3
    for (int d = 0; d < D; ++d) k[size_t(j * D + d)] *= j % 7 == 0 ? 300.0f : 1.0f;
  std::vector<float> o(q.size()), r(q.size());
  ops::attention(&pool, q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 0.5f, o.data());
  ops::attention_ref(q.data(), k.data(), v.data(), T, n_kv, Hq, Hkv, D, 0.5f, r.data());
  for (float x : o) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(rel_l2(o, r), 1e-5);
}

// Chunked (WY form) vs recurrent delta rule: same math, f32 rounding only (~1e-6 relative).
TEST(Ops, ChunkedDeltaRuleMatchesRecurrentAcrossChunkBoundaries) {
  ThreadPool pool(2);
  const int Hk = 2, Hv = 4, dk = 16, dv = 8;
  for (int64_t T : {2, 63, 64, 65, 130}) {
    auto q = randn(size_t(T * Hk * dk), 10), k = randn(size_t(T * Hk * dk), 11), v = randn(size_t(T * Hv * dv), 12);
    auto raw_b = randn(size_t(T * Hv), 13), raw_g = randn(size_t(T * Hv), 14);
    ops::l2_norm(q.data(), T * Hk, dk, 1e-6, 1.0f / std::sqrt(float(dk)));
    ops::l2_norm(k.data(), T * Hk, dk, 1e-6, 1.0f);
    std::vector<float> beta(raw_b.size()), g(raw_g.size());
    for (size_t i = 0; i < beta.size(); ++i) beta[i] = ops::sigmoid(raw_b[i]), g[i] = -std::exp(raw_g[i]) * 0.3f;
    auto s0 = randn(size_t(Hv * dk * dv), 15, 0.5f);  // a non-zero incoming state
    std::vector<float> s_rec = s0, s_chk = s0, o_rec(size_t(T * Hv * dv)), o_chk(o_rec.size());
    ops::DeltaRuleArgs a{T, Hk, Hv, dk, dv, q.data(), k.data(), v.data(), Hk * dk, Hk * dk, Hv * dv,
                         beta.data(), g.data(), s_rec.data(), o_rec.data()};
    ops::gated_delta_rule_recurrent(nullptr, a);
    a.state = s_chk.data(), a.out = o_chk.data();
    ops::gated_delta_rule_chunked(&pool, a);
    EXPECT_LE(rel_l2(o_chk, o_rec), 1e-5) << "T=" << T;
    EXPECT_LE(rel_l2(s_chk, s_rec), 1e-5) << "T=" << T;
  }
}

// The chunked rule keeps per-thread scratch sized for the largest heads it has seen: a later
// call with smaller heads must write exactly its own state and outputs (a guard after each stays
// untouched). ASan found the state write-back once running over the old, larger size.
TEST(Ops, ChunkedDeltaRuleWritesOnlyItsOwnStateAfterLargerHeads) {
  for (const int d : {32, 8}) {  // larger heads first: the scratch grows, then is reused
    const int64_t T = 70;
    const int Hk = 1, Hv = 2, dk = d, dv = d;
    auto q = randn(size_t(T * Hk * dk), 20), k = randn(size_t(T * Hk * dk), 21), v = randn(size_t(T * Hv * dv), 22);
    ops::l2_norm(q.data(), T * Hk, dk, 1e-6, 1.0f / std::sqrt(float(dk)));
    ops::l2_norm(k.data(), T * Hk, dk, 1e-6, 1.0f);
    std::vector<float> beta(size_t(T * Hv), 0.5f), g(size_t(T * Hv), -0.1f);
    constexpr float kGuard = 12345.0f;
    const size_t state_n = size_t(Hv) * dk * dv, out_n = size_t(T * Hv * dv);
    std::vector<float> state(state_n + 64, kGuard), out(out_n + 64, kGuard);
    std::fill(state.begin(), state.begin() + state_n, 0.0f);
    ops::DeltaRuleArgs a{T, Hk, Hv, dk, dv, q.data(), k.data(), v.data(), Hk * dk, Hk * dk, Hv * dv,
                         beta.data(), g.data(), state.data(), out.data()};
    ops::gated_delta_rule_chunked(nullptr, a);  // on this thread: the scratch is this thread's
    for (size_t i = state_n; i < state.size(); ++i) ASSERT_EQ(state[i], kGuard) << "d=" << d << " state+" << i;
    for (size_t i = out_n; i < out.size(); ++i) ASSERT_EQ(out[i], kGuard) << "d=" << d << " out+" << i;
  }
}

TEST(Ops, ConvCarriesStateAcrossCalls) {
  const int64_t C = 5, T = 7;
  const int K = 4;
  auto x = randn(size_t(T * C), 1), w = randn(size_t(C * K), 2);
  std::vector<float> st_a(size_t((K - 1) * C), 0.f), st_b = st_a, all(size_t(T * C)), parts(size_t(T * C));
  ops::conv1d_silu(x.data(), T, C, K, w.data(), st_a.data(), all.data());
  ops::conv1d_silu(x.data(), 3, C, K, w.data(), st_b.data(), parts.data());
  ops::conv1d_silu(x.data() + 3 * C, T - 3, C, K, w.data(), st_b.data(), parts.data() + 3 * C);
  EXPECT_EQ(all, parts);
  EXPECT_EQ(st_a, st_b);
  // One step at a time (decode; fewer steps than the history, so history rows move within it).
  std::vector<float> st_c(size_t((K - 1) * C), 0.f), steps(size_t(T * C));
  for (int64_t t = 0; t < T; ++t)
    ops::conv1d_silu(x.data() + t * C, 1, C, K, w.data(), st_c.data(), steps.data() + t * C);
  EXPECT_EQ(all, steps);
  EXPECT_EQ(st_a, st_c);
  // Newest tap is w[K−1]: a single impulse at t=0 shows the taps in reverse order over time.
  std::vector<float> imp(size_t(T * C), 0.f), st(size_t((K - 1) * C), 0.f), out(size_t(T * C));
  imp[0] = 1.0f;
  ops::conv1d_silu(imp.data(), T, C, K, w.data(), st.data(), out.data());
  for (int s = 0; s < K; ++s) EXPECT_FLOAT_EQ(out[size_t(s * C)], ops::silu(w[size_t(K - 1 - s)]));
}

TEST(Ops, RouterRenormalisesTopK) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ops::moe_route(logits.data(), 1, 5, 2, ids.data(), w.data());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6);
  EXPECT_NEAR(w[0] / w[1], std::exp(0.5f), 1e-5);
}

TEST(ThreadPool, CoversEveryIndexOnceFromManyCallers) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::vector<std::vector<int>> hits(4, std::vector<int>(1000, 0));
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 20; ++rep)
        pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(c)][size_t(i)]++;
        });
    });
  for (auto& t : callers) t.join();
  for (const auto& h : hits)
    for (int x : h) EXPECT_EQ(x, 20);
}

// silu_mul against silu(g)·u in double: within a few float ulps across the whole range (vector
// e^x on AVX2), exact limits far out, and the same bits for an element wherever a row is split.
TEST(Ops, SiluMatchesDoubleEverywhereAndIgnoresSplits) {
  std::vector<float> g, u;
  for (int i = -2000; i <= 2000; ++i) g.push_back(float(i) * 0.05f), u.push_back(1.0f + float(i % 7) * 0.25f);
  for (float x : {-200.0f, -88.0f, -87.0f, 88.0f, 89.0f, 200.0f, 1e-30f, -1e-30f, 0.0f})
    g.push_back(x), u.push_back(1.5f);
  const auto n = int64_t(g.size());
  std::vector<float> y(g.size());
  ops::silu_mul(g.data(), n, u.data(), n, 1, n, y.data());
  for (int64_t i = 0; i < n; ++i) {
    const double x = g[size_t(i)], want = x / (1.0 + std::exp(-x)) * u[size_t(i)];
    EXPECT_NEAR(y[size_t(i)], want, 4e-7 * std::abs(want) + 1e-30) << "x=" << x;
  }
  // Pieces of 1..11 elements: every element bitwise equal to the whole-row result.
  std::vector<float> pieces(g.size());
  for (int64_t i = 0, len = 1; i < n; i += len, len = len % 11 + 1) {
    const int64_t m = std::min(len, n - i);
    ops::silu_mul(g.data() + i, m, u.data() + i, m, 1, m, pieces.data() + i);
  }
  EXPECT_EQ(pieces, y);
  // silu_inplace (the conv's SiLU) is silu_mul with u = 1, bit for bit, in any pieces too.
  std::vector<float> ones(g.size(), 1.0f), with_ones(g.size()), inplace = g, inplace_pieces = g;
  ops::silu_mul(g.data(), n, ones.data(), n, 1, n, with_ones.data());
  ops::silu_inplace(inplace.data(), n);
  EXPECT_EQ(inplace, with_ones);
  for (int64_t i = 0, len = 3; i < n; i += len, len = len % 13 + 1)
    ops::silu_inplace(inplace_pieces.data() + i, std::min(len, n - i));
  EXPECT_EQ(inplace_pieces, with_ones);
}

}  // namespace
}  // namespace kiln::engine
