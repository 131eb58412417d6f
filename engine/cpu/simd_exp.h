// e^x on eight floats with AVX2 + FMA, for the kernels' softmax and SiLU (libm's scalar expf
// cost ~20 cycles an element: 2-4% of a prefill). Cephes' expf: x = n·ln2 + r with ln2 split in
// two so r is exact, a degree-5 polynomial for e^r, 2^n built in the exponent bits. Within 2 ulp
// of std::exp; 0 below e^-87.3 (where results turn subnormal), +inf above e^88.4, NaN stays NaN.
// Include only from code compiled for AVX2 + FMA (a target pragma region or attribute).
#pragma once

#include <immintrin.h>

namespace kiln::engine::cpu {

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f), highest = _mm256_set1_ps(88.3762626647949f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  const __m256 overflow = _mm256_cmp_ps(x, highest, _CMP_GT_OQ);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), overflow);
  return _mm256_blendv_ps(y, x, nan);
}

}  // namespace kiln::engine::cpu
