// q8 and q4 matrix products on AVX2 + FMA + F16C (matmul_quant_avx2.cpp): the q8/q4 entries of
// kernels_avx2()'s table. Call only when cpu_features().has_avx2_set().
#pragma once

#include <cstdint>

#include "engine/cpu/matmul.h"

namespace kiln::engine::cpu::avx2 {

void matmul_q8(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0,
               int64_t r1);
void matmul_q4(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy, int64_t r0,
               int64_t r1);

}  // namespace kiln::engine::cpu::avx2
