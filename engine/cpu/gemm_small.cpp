#include "engine/cpu/gemm_small.h"

#include <algorithm>

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
void gemm_f32_ref(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                  float* C, int ldc) {
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

#if defined(__x86_64__)
namespace {

// One AVX2 vector of T: its lane count and the few operations the tiles use.
template <class T>
struct Vec;
template <>
struct Vec<double> {
  using V = __m256d;
  static constexpr int kLanes = 4;
  __attribute__((target("avx2,fma"))) static V zero() { return _mm256_setzero_pd(); }
  __attribute__((target("avx2,fma"))) static V load(const double* p) { return _mm256_loadu_pd(p); }
  __attribute__((target("avx2,fma"))) static V bcast(const double* p) { return _mm256_broadcast_sd(p); }
  __attribute__((target("avx2,fma"))) static V set1(double v) { return _mm256_set1_pd(v); }
  __attribute__((target("avx2,fma"))) static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  __attribute__((target("avx2,fma"))) static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  __attribute__((target("avx2,fma"))) static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
};
template <>
struct Vec<float> {
  using V = __m256;
  static constexpr int kLanes = 8;
  __attribute__((target("avx2,fma"))) static V zero() { return _mm256_setzero_ps(); }
  __attribute__((target("avx2,fma"))) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2,fma"))) static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  __attribute__((target("avx2,fma"))) static V set1(float v) { return _mm256_set1_ps(v); }
  __attribute__((target("avx2,fma"))) static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  __attribute__((target("avx2,fma"))) static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  __attribute__((target("avx2,fma"))) static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};

// R rows × two vectors of columns of C.
template <class T, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void tile(int k, T alpha, const T* A, int lda, const T* B,
                                                                    int ldb, T beta, T* C, int ldc) {
  using W = Vec<T>;
  constexpr int L = W::kLanes;
  typename W::V acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = W::zero();
  for (int p = 0; p < k; ++p) {
    const auto b0 = W::load(B + p * ldb), b1 = W::load(B + p * ldb + L);
    for (int r = 0; r < R; ++r) {
      const auto a = W::bcast(A + r * lda + p);
      acc[r][0] = W::fma(a, b0, acc[r][0]);
      acc[r][1] = W::fma(a, b1, acc[r][1]);
    }
  }
  const auto va = W::set1(alpha), vb = W::set1(beta);
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      T* c = C + r * ldc + L * h;
      auto v = W::mul(va, acc[r][h]);
      if (beta != 0) v = W::fma(vb, W::load(c), v);
      W::store(c, v);
    }
}

// Rows [i, i + R) of C over every column slab (lower_c: only slabs starting at or before the
// tile's last row).
template <class T, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void row_tile(int i, int n_slabs, int k, T alpha, const T* A,
                                                                        int lda, const T* B, int ldb, T beta, T* C,
                                                                        int ldc, Triangle shape) {
  constexpr int S = 2 * Vec<T>::kLanes;
  const int depth = shape == Triangle::lower_a ? std::min(k, i + R) : k;  // lower_a: p < i + R
  const int j_end = shape == Triangle::lower_c ? std::min(n_slabs, (i + R + S - 1) / S * S) : n_slabs;
  for (int j = 0; j < j_end; j += S) tile<T, R>(depth, alpha, A + i * lda, lda, B + j, ldb, beta, C + i * ldc + j, ldc);
}

template <class T>
__attribute__((target("avx2,fma"))) void gemm_avx2(int m, int n, int k, T alpha, const T* A, int lda, const T* B,
                                                   int ldb, T beta, T* C, int ldc, Triangle shape) {
  // Row tiles outer, column slabs inner: a tile's rows of A (R·k values) stay in L1 while B
  // streams past as whole vectors (column slabs outer re-read all of A from L2 per slab, one
  // value per broadcast). Six rows: twelve accumulators cover the 4-cycle FMA latency at two
  // FMAs a cycle.
  constexpr int S = 2 * Vec<T>::kLanes;
  const int n_slabs = n / S * S;
  int i = 0;
  for (; i + 6 <= m; i += 6) row_tile<T, 6>(i, n_slabs, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  for (; i + 4 <= m; i += 4) row_tile<T, 4>(i, n_slabs, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  for (; i < m; ++i) row_tile<T, 1>(i, n_slabs, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  if (n_slabs < n) gemm_ref(m, n - n_slabs, k, alpha, A, lda, B + n_slabs, ldb, beta, C + n_slabs, ldc);
}

bool have_avx2() {
  static const bool avx2 = cpu_features().has_avx2_set();
  return avx2;
}

}  // namespace
#endif

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb, double beta,
              double* C, int ldc, Triangle shape) {
#if defined(__x86_64__)
  if (have_avx2()) return gemm_avx2(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
#endif
  (void)shape;  // the plain loops compute every entry, every term
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_f32(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
              float* C, int ldc) {
#if defined(__x86_64__)
  if (have_avx2()) return gemm_avx2(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, Triangle::none);
#endif
  gemm_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace kiln::engine::cpu
