// The fused Gated DeltaNet decode step (ops::gated_delta_net_decode) against the unfused ops the
// prefill path and the old decode path run: conv1d_silu, l2_norm, the β/g gates,
// gated_delta_rule_decode and rms_norm_gated. Fusion must not change a single bit (batched
// sessions and prefill/decode consistency rely on it), with or without a pool, for f32 and bf16
// conv windows, over several steps so the updated conv window and state feed the next step.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/ops.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::randn;

struct Shape {
  int Hk, Hv, dk, dv, K;
};

// One decode step the unfused way (what Qwen35Model ran before the fusion).
void unfused_step(const Shape& s, const float* qkv, const float* z, const float* b, const float* a,
                  const std::vector<float>& conv_w, std::vector<uint8_t>& conv_state, bool bf16,
                  const std::vector<float>& A_log, const std::vector<float>& dt_bias, const std::vector<float>& norm_w,
                  double eps, float* state, float* out) {
  const int64_t key_dim = int64_t(s.Hk) * s.dk, C = 2 * key_dim + int64_t(s.Hv) * s.dv;
  std::vector<float> window(size_t((s.K - 1) * C)), ch(static_cast<size_t>(C));
  std::vector<float> beta(static_cast<size_t>(s.Hv)), g(static_cast<size_t>(s.Hv));
  for (size_t i = 0; i < window.size(); ++i)
    window[i] = bf16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(conv_state.data())[i])
                     : reinterpret_cast<const float*>(conv_state.data())[i];
  ops::conv1d_silu(qkv, 1, C, s.K, conv_w.data(), window.data(), ch.data());
  for (size_t i = 0; i < window.size(); ++i) {
    if (bf16) reinterpret_cast<uint16_t*>(conv_state.data())[i] = f32_to_bf16(window[i]);
    else reinterpret_cast<float*>(conv_state.data())[i] = window[i];
  }
  ops::l2_norm(ch.data(), s.Hk, s.dk, 1e-6, 1.0f / std::sqrt(float(s.dk)));
  ops::l2_norm(ch.data() + key_dim, s.Hk, s.dk, 1e-6, 1.0f);
  for (int j = 0; j < s.Hv; ++j) {
    const float u = a[j] + dt_bias[size_t(j)];
    const float softplus = u > 20.0f ? u : std::log1p(std::exp(u));
    beta[size_t(j)] = ops::sigmoid(b[j]);
    g[size_t(j)] = -std::exp(A_log[size_t(j)]) * softplus;
  }
  const ops::DeltaRuleArgs d{1, s.Hk, s.Hv, s.dk, s.dv, ch.data(), ch.data() + key_dim, ch.data() + 2 * key_dim,
                             C, C, C, beta.data(), g.data(), state, out};
  ops::gated_delta_rule_decode(nullptr, d);
  ops::rms_norm_gated(out, z, s.Hv, s.dv, norm_w.data(), eps, out);
}

TEST(GdnDecode, FusedStepEqualsTheUnfusedOpsBitForBit) {
  ThreadPool pool(3);
  // dk = 24 and r·dv = 40: runs of 16 channels and a shorter one
  for (const Shape s :
       {Shape{2, 4, 16, 8, 4}, Shape{3, 3, 32, 16, 4}, Shape{1, 2, 8, 24, 3}, Shape{2, 4, 24, 20, 4}})
    for (bool bf16 : {false, true})
      for (ThreadPool* p : {&pool, static_cast<ThreadPool*>(nullptr)}) {
        std::mt19937_64 rng(uint64_t(s.Hk * 1000 + s.dv * 10 + bf16));
        const int64_t key_dim = int64_t(s.Hk) * s.dk, value_dim = int64_t(s.Hv) * s.dv;
        const int64_t C = 2 * key_dim + value_dim;
        const auto conv_w = randn(size_t(C * s.K), rng, 0.5f), A_log = randn(size_t(s.Hv), rng, 0.5f);
        std::vector<float> conv_taps(conv_w.size());  // [K][C], as the model binds it
        for (int64_t ch = 0; ch < C; ++ch)
          for (int t = 0; t < s.K; ++t) conv_taps[size_t(t * C + ch)] = conv_w[size_t(ch * s.K + t)];
        const auto dt_bias = randn(size_t(s.Hv), rng), norm_w = randn(size_t(s.dv), rng);
        const size_t elt = bf16 ? 2 : 4;
        std::vector<uint8_t> conv_ref(size_t((s.K - 1) * C) * elt, 0), conv_fused = conv_ref;
        std::vector<float> state_ref(size_t(s.Hv) * s.dk * s.dv, 0.0f), state_fused = state_ref;
        for (int step = 0; step < 5; ++step) {
          // a > 20 on some heads exercises softplus's linear branch
          auto qkv = randn(size_t(C), rng), z = randn(size_t(value_dim), rng), b = randn(size_t(s.Hv), rng);
          auto a = randn(size_t(s.Hv), rng, 12.0f);
          std::vector<float> out_ref(static_cast<size_t>(value_dim)), out_fused(static_cast<size_t>(value_dim));
          unfused_step(s, qkv.data(), z.data(), b.data(), a.data(), conv_w, conv_ref, bf16, A_log, dt_bias, norm_w,
                       1e-6, state_ref.data(), out_ref.data());
          const ops::GdnDecodeArgs args{s.Hk,
                                        s.Hv,
                                        s.dk,
                                        s.dv,
                                        s.K,
                                        qkv.data(),
                                        z.data(),
                                        b.data(),
                                        a.data(),
                                        conv_taps.data(),
                                        conv_fused.data(),
                                        bf16,
                                        A_log.data(),
                                        dt_bias.data(),
                                        norm_w.data(),
                                        1e-6,
                                        state_fused.data(),
                                        out_fused.data()};
          ops::gated_delta_net_decode(p, args);
          const char* where = p ? "pool" : "no pool";
          ASSERT_EQ(0, std::memcmp(out_ref.data(), out_fused.data(), out_ref.size() * 4))
              << "output differs, step " << step << ", Hk=" << s.Hk << " bf16=" << bf16 << " " << where;
          ASSERT_EQ(conv_ref, conv_fused) << "conv window differs, step " << step << " " << where;
          ASSERT_EQ(0, std::memcmp(state_ref.data(), state_fused.data(), state_ref.size() * 4))
              << "state differs, step " << step << " " << where;
        }
      }
}

}  // namespace
}  // namespace kiln::engine
