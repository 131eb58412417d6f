// ops::matmul_swiglu_group (gate and up rows of a pair computed in one work item, SwiGLU applied
// there) against the unfused sequence the model ran before: matmul_group of every gate and up
// product, then silu_mul. Must be identical bit for bit (batched = solo and prefill/decode
// consistency rely on it) for q8, q4 and bf16 weights, a decode token (T = 1, every expert on the
// same input) and a prompt chunk (T > 8: 16-row panels), with and without a pool; and a plain
// product (no up matrix) sharing the section equals ops::matmul.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cpu/matmul.h"
#include "engine/ops.h"
#include "test_math.h"

namespace kiln::engine {
namespace {

using testing::randn;

struct StoredMatrix {
  std::vector<uint8_t> bytes;
  Matrix m;
};

StoredMatrix stored(Dtype dt, int64_t rows, int64_t cols, std::mt19937_64& g) {
  const auto w = randn(size_t(rows * cols), g);
  const cpu::WeightFormat f = dt == Dtype::q8 ? cpu::WeightFormat::q8
                              : dt == Dtype::q4 ? cpu::WeightFormat::q4
                                                : cpu::WeightFormat::bf16;
  StoredMatrix s;
  s.bytes.resize(size_t(rows) * cpu::row_bytes(f, cols));
  cpu::quantize_matrix(cpu::kernels_ref(), f, w.data(), rows, cols, s.bytes.data());
  s.m = Matrix{s.bytes.data(), dt, rows, cols};
  return s;
}

TEST(SwigluGroup, EqualsGateUpProductsThenSiluMulBitForBit) {
  ThreadPool pool(2);
  constexpr int64_t K = 256, I = 72;  // I not a multiple of 16: a partial last panel
  for (Dtype dt : {Dtype::q8, Dtype::q4, Dtype::bf16})
    for (int64_t T : {1, 3, 20})
      for (ThreadPool* p : {&pool, static_cast<ThreadPool*>(nullptr)}) {
        std::mt19937_64 g(uint64_t(int(dt) * 100 + T));
        constexpr int kPairs = 4;
        std::vector<StoredMatrix> gate, up;
        for (int i = 0; i < kPairs; ++i) gate.push_back(stored(dt, I, K, g)), up.push_back(stored(dt, I, K, g));
        // Pairs 0-2 read one input (a decode step's experts), pair 3 its own.
        const auto x0 = randn(size_t(T * K), g), x1 = randn(size_t(T * K), g);
        auto input = [&](int i) { return i < 3 ? x0.data() : x1.data(); };
        std::vector<std::vector<float>> want(kPairs), gw(kPairs), uw(kPairs);
        std::vector<ops::MatmulJob> jobs;
        for (int i = 0; i < kPairs; ++i) {
          gw[size_t(i)].assign(size_t(T * I), 0.0f), uw[size_t(i)].assign(size_t(T * I), 0.0f);
          jobs.push_back({&gate[size_t(i)].m, input(i), T, gw[size_t(i)].data()});
          jobs.push_back({&up[size_t(i)].m, input(i), T, uw[size_t(i)].data()});
        }
        ops::matmul_group(p, jobs.data(), int(jobs.size()));
        for (int i = 0; i < kPairs; ++i) {
          want[size_t(i)].assign(size_t(T * I), 0.0f);
          ops::silu_mul(gw[size_t(i)].data(), I, uw[size_t(i)].data(), I, T, I, want[size_t(i)].data());
        }
        std::vector<std::vector<float>> gs(kPairs), us(kPairs);
        std::vector<ops::SwigluJob> sw;
        for (int i = 0; i < kPairs; ++i) {
          gs[size_t(i)].assign(size_t(T * I), 0.0f), us[size_t(i)].assign(size_t(T * I), 0.0f);
          // h in place over g, as the model does
          sw.push_back({&gate[size_t(i)].m, &up[size_t(i)].m, input(i), T, gs[size_t(i)].data(), us[size_t(i)].data(),
                        gs[size_t(i)].data()});
        }
        // A plain product riding along (the router in a decode step): equals ops::matmul.
        std::vector<float> plain(size_t(T * I), 0.0f), plain_want(size_t(T * I), 0.0f);
        sw.push_back({&gate[0].m, nullptr, x1.data(), T, plain.data(), nullptr, nullptr});
        ops::matmul_swiglu_group(p, sw.data(), int(sw.size()));
        ops::matmul(nullptr, x1.data(), T, gate[0].m, plain_want.data());
        ASSERT_EQ(0, std::memcmp(plain_want.data(), plain.data(), plain.size() * 4)) << "plain job, " << dtype_name(dt);
        for (int i = 0; i < kPairs; ++i)
          ASSERT_EQ(0, std::memcmp(want[size_t(i)].data(), gs[size_t(i)].data(), size_t(T * I) * 4))
              << dtype_name(dt) << " T=" << T << " pair " << i << (p ? " pool" : " no pool");
      }
}

}  // namespace
}  // namespace kiln::engine
