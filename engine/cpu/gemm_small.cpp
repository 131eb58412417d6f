#include "engine/cpu/gemm_small.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "engine/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::engine::cpu {
namespace {

template <class T>
void gemm_ref(int m, int n, int k, T alpha, const T* A, int lda, const T* B, int ldb, T beta, T* C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      T s = 0;
      for (int p = 0; p < k; ++p) s += A[i * lda + p] * B[p * ldb + j];
      C[i * ldc + j] = (beta == 0 ? T(0) : beta * C[i * ldc + j]) + alpha * s;
    }
}

}  // namespace

void gemm_f64_ref(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
                  double beta, double* C, int ldc) {
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm_f32_ref(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

#if defined(__x86_64__)
// The tiles (gemm_small_tiles.inc) are written once over a vector type W and compiled twice, in a
// region per target: W = AVX2 vectors and W = AVX-512 vectors.
// Every entry of C sums its k terms in order by FMA in both (a lane is a column), so the two give
// the same bits whenever their column slabs cover the same columns (n a multiple of 32 floats /
// 16 doubles: the state products; a prompt's last partial chunk can differ in its last bits, as
// columns past the slabs go through the plain loop).

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
namespace {
template <class Scalar>
struct Vec;
template <>
struct Vec<double> {
  using T = double;
  using V = __m256d;
  static constexpr int kLanes = 4, kRows = 6;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static V bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static V set1(double v) { return _mm256_set1_pd(v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
};
template <>
struct Vec<float> {
  using T = float;
  using V = __m256;
  static constexpr int kLanes = 8, kRows = 6;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
#include "engine/cpu/gemm_small_tiles.inc"
}  // namespace
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f")
namespace avx512 {
namespace {
template <class Scalar>
struct Vec;
template <>
struct Vec<double> {
  using T = double;
  using V = __m512d;
  static constexpr int kLanes = 8, kRows = 8;  // 16 accumulators of the 32 registers
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static V bcast(const double* p) { return _mm512_set1_pd(*p); }
  static V set1(double v) { return _mm512_set1_pd(v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
};
template <>
struct Vec<float> {
  using T = float;
  using V = __m512;
  static constexpr int kLanes = 16, kRows = 8;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
#include "engine/cpu/gemm_small_tiles.inc"
}  // namespace
}  // namespace avx512
#pragma GCC pop_options

namespace {
template <class T>
bool gemm_fast(GemmPath path, int m, int n, int k, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
               T* C, int ldc, Triangle shape) {
  switch (path) {
    case GemmPath::avx512:
      avx512::gemm<avx512::Vec<T>>(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
      return true;
    case GemmPath::avx2:
      avx2::gemm<avx2::Vec<T>>(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
      return true;
    case GemmPath::ref:
      break;
  }
  return false;
}
}  // namespace
#endif

bool gemm_path_available(GemmPath path) {
  switch (path) {
    case GemmPath::ref:
      return true;
    case GemmPath::avx2:
      return cpu_features().has_avx2_set();
    case GemmPath::avx512:
      return cpu_features().has_avx512_set();
  }
  return false;
}

GemmPath best_gemm_path() {
  // KILN_CPU_KERNELS=ref|avx2 (matmul_ref.cpp) pins these products to the same level as the
  // matrix kernels, so an A/B timing compares whole paths.
  static const GemmPath best = [] {
    const char* env = std::getenv("KILN_CPU_KERNELS");
    const std::string_view pinned = env ? env : "";
    if (pinned == "ref") return GemmPath::ref;
    if (pinned != "avx2" && gemm_path_available(GemmPath::avx512)) return GemmPath::avx512;
    return gemm_path_available(GemmPath::avx2) ? GemmPath::avx2 : GemmPath::ref;
  }();
  return best;
}

void gemm_f64_on(GemmPath path, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
                 int ldb, double beta, double* C, int ldc, Triangle shape) {
#if defined(__x86_64__)
  if (gemm_fast(path, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape)) return;
#endif
  (void)path;
  (void)shape;  // the plain loops compute every entry, every term
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_f32_on(GemmPath path, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc) {
#if defined(__x86_64__)
  if (gemm_fast(path, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, Triangle::none)) return;
#endif
  (void)path;
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
              double beta, double* C, int ldc, Triangle shape) {
  gemm_f64_on(best_gemm_path(), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
}

void gemm_f32(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
              float* C, int ldc) {
  gemm_f32_on(best_gemm_path(), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace kiln::engine::cpu
