#include "engine/cpu/gemm_f64.h"

#include <algorithm>

#include "engine/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::engine::cpu {

void gemm_f64_ref(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
                  double beta, double* C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += A[i * lda + p] * B[p * ldb + j];
      C[i * ldc + j] = (beta == 0 ? 0.0 : beta * C[i * ldc + j]) + alpha * s;
    }
}

#if defined(__x86_64__)
namespace {

// R rows × 8 columns of C.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void tile(int k, double alpha, const double* A, int lda, const double* B,
                                                     int ldb, double beta, double* C, int ldc) {
  __m256d acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
  for (int p = 0; p < k; ++p) {
    const __m256d b0 = _mm256_loadu_pd(B + p * ldb), b1 = _mm256_loadu_pd(B + p * ldb + 4);
    for (int r = 0; r < R; ++r) {
      const __m256d a = _mm256_broadcast_sd(A + r * lda + p);
      acc[r][0] = _mm256_fmadd_pd(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_pd(a, b1, acc[r][1]);
    }
  }
  const __m256d va = _mm256_set1_pd(alpha), vb = _mm256_set1_pd(beta);
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      double* c = C + r * ldc + 4 * h;
      __m256d v = _mm256_mul_pd(va, acc[r][h]);
      if (beta != 0) v = _mm256_fmadd_pd(vb, _mm256_loadu_pd(c), v);
      _mm256_storeu_pd(c, v);
    }
}

// Rows [i, i + R) of C over every column slab (lower_c: only slabs starting at or before the
// tile's last row).
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void row_tile(int i, int n8, int k, double alpha,
                                                                        const double* A, int lda, const double* B,
                                                                        int ldb, double beta, double* C, int ldc,
                                                                        Triangle shape) {
  const int depth = shape == Triangle::lower_a ? std::min(k, i + R) : k;  // lower_a: p < i + R
  const int j_end = shape == Triangle::lower_c ? std::min(n8, (i + R + 7) / 8 * 8) : n8;
  for (int j = 0; j < j_end; j += 8) tile<R>(depth, alpha, A + i * lda, lda, B + j, ldb, beta, C + i * ldc + j, ldc);
}

__attribute__((target("avx2,fma"))) void gemm_f64_avx2(int m, int n, int k, double alpha, const double* A, int lda,
                                                       const double* B, int ldb, double beta, double* C, int ldc,
                                                       Triangle shape) {
  // Row tiles outer, column slabs inner: a tile's rows of A (R·k doubles) stay in L1 while B
  // streams past as whole vectors (column slabs outer re-read all of A from L2 per slab, eight
  // bytes per broadcast). Six rows: twelve accumulators cover the 4-cycle FMA latency at two
  // FMAs a cycle. Every entry still sums its k terms in order: the tiling never changes a result.
  const int n8 = n / 8 * 8;
  int i = 0;
  for (; i + 6 <= m; i += 6) row_tile<6>(i, n8, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  for (; i + 4 <= m; i += 4) row_tile<4>(i, n8, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  for (; i < m; ++i) row_tile<1>(i, n8, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
  if (n8 < n) gemm_f64_ref(m, n - n8, k, alpha, A, lda, B + n8, ldb, beta, C + n8, ldc);
}

}  // namespace
#endif

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb, double beta,
              double* C, int ldc, Triangle shape) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_features().has_avx2_set();
  if (avx2) return gemm_f64_avx2(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, shape);
#endif
  (void)shape;  // the plain loops compute every entry, every term
  gemm_f64_ref(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace kiln::engine::cpu
