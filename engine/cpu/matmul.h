// Matrix products over stored weights (f32, bf16, q8, q4): y = x · Wᵀ for n tokens.
//
// Dimension names: K = cols (input features), N = rows (output features), T = tokens.
//   W  [N, K] in `format` (see quant.h),  x [T, K] f32,  y [T, ldy] f32 with y[t*ldy + r].
//
// Every kernel is a pure function over a row range [r0, r1): threads split the rows of one
// product and never write the same y element, so any thread pool can drive them. With T == 1
// (decode) a kernel streams each weight row once; with T > 1 (prefill) it tiles over tokens so
// a weight block is loaded once per tile of tokens, not once per token.
//
// Quantized formats multiply in integers: activations are first quantized per token to int16
// (ActQ16View), then  y = d_x · Σ_blocks (d_w · Σ q_w q_x  [+ m_w · Σ q_x for q4]).
//
// Kernel tables: `kernels_ref()` is the plain scalar reference (never optimized; also the
// portable fallback), `kernels_avx2()` / `kernels_avx512()` the SIMD paths (nullptr when the
// running CPU lacks them), `kernels_best()` the one the CPU supports best, chosen once by CPUID.
#pragma once

#include <cstdint>

#include "engine/cpu/quant.h"

namespace kiln::engine::cpu {

// How the q8/q4 kernels split work by token count, for callers sizing row ranges: up to
// kQuantStreamMaxTokens tokens they stream rows (any range works well); from one more they work
// kQuantPanelRows rows at a time, so a range should be a multiple of it. AVX2, 5-8 tokens:
// streaming passes of up to 3 tokens over each 16 rows, the later ones from L1; 9 or more:
// unpacked int16 panels. AVX-512: passes of up to 4 tokens up to 32 tokens (q8) or 16 (q4), then
// panels (matmul_avx512.cpp). Measured on the bench model, 8 batched sessions, 4 interleaved runs each: passes gave
// 66-70 tok/s aggregate against 58-66 with panels from 5 tokens (the unpacking, ~0.3
// instructions per weight, is not repaid by 5-8 tokens; measured with the earlier streaming
// kernel). Passes of 3 tokens on 4-row tiles against passes of 4 on 2-row tiles: 87.7, 95.2,
// 90.1 against 80.9, 82.2, 75.5 tok/s at 8 sessions, interleaved.
inline constexpr int64_t kQuantStreamMaxTokens = 4;
inline constexpr int64_t kQuantPanelRows = 16;

// The q8/q4 prefill kernels' per-thread scratch for one panel of kQuantPanelRows rows unpacked to
// int16 (matmul_quant_avx2.cpp, matmul_quant_avx512.cpp), grown on first use and reused.
struct QuantPanelScratch {
  int16_t* w;  // [block][pair 0..15][row 0..15][2]
  float* d;    // [block][row 0..15] block scales
  float* m;    // [block][row 0..15] q4 block offsets
};
QuantPanelScratch quant_panel_scratch(int64_t k);

struct WeightMatrix {
  WeightFormat format = WeightFormat::f32;
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  const uint8_t* data = nullptr;  // rows × row_bytes(format, cols), row after row
  size_t stride() const { return row_bytes(format, cols); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * stride(); }
};

// What a kernel reads as its input: f32 rows for f32/bf16 weights, int16 for q8/q4.
struct MatmulInput {
  int64_t n = 0, k = 0;
  const float* f32 = nullptr;  // [n, k] when the weights are f32 or bf16
  ActQ16View q16;              // when the weights are q8 or q4
};

using MatmulFn = void (*)(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                          int64_t r0, int64_t r1);
using QuantizeRowFn = void (*)(const float* src, uint8_t* dst, int64_t cols);
using QuantizeActsFn = ActQ16Buffer::QuantizeActsFn;

struct KernelTable {
  const char* name;                            // "ref", "avx2", "avx512"
  MatmulFn matmul[kWeightFormatCount];         // indexed by WeightFormat
  QuantizeRowFn quantize[kWeightFormatCount];  // f32 → one stored row
  QuantizeActsFn quantize_acts;                // f32 → int16, one token
};

const KernelTable& kernels_ref();
const KernelTable* kernels_avx2();    // nullptr unless the CPU has AVX2 + FMA + F16C
const KernelTable* kernels_avx512();  // nullptr unless the CPU has AVX-512 F/BW/VL + VNNI
const KernelTable& kernels_best();    // the best of the above for this CPU, chosen once

// Builds the kernel input from f32 activations x [n, k]; for q8/q4 this quantizes into `buf`
// (which owns the int16 data and must outlive the returned view).
MatmulInput prepare_input(const KernelTable& kt, WeightFormat format, const float* x, int64_t n,
                          int64_t k, ActQ16Buffer& buf);

// Convenience for callers without a pool: whole product on the calling thread.
void matmul(const KernelTable& kt, const WeightMatrix& w, const float* x, int64_t n, float* y,
            int64_t ldy, ActQ16Buffer& buf);

// Quantizes a whole f32 [rows, cols] matrix into `dst` (rows × row_bytes) with the given table.
void quantize_matrix(const KernelTable& kt, WeightFormat format, const float* src, int64_t rows,
                     int64_t cols, uint8_t* dst);

}  // namespace kiln::engine::cpu
