// Small dense matrix products for the chunked gated delta rule (delta_rule.cpp): double for the
// chunk-internal math (see there why), float for the products with the state. Row-major with
// leading dimensions:
//   C[m][n] = beta·C + alpha · A[m][k] · B[k][n]        (beta = 0: C is only written)
// gemm_f64/gemm_f32 pick the best kernel the CPU has: AVX-512 (8-row tiles of two vectors'
// columns: 8×16 doubles, 8×32 floats), AVX2+FMA (6×8 doubles, 6×16 floats; both with 4-row and
// single-row tiles at the edge), else the reference. Every entry sums its k terms in order, whatever the
// tiling. Twins: the _ref plain loops, compared in tests/engine/kernel_gemm_small_test.cpp.
#pragma once

namespace kiln::engine::cpu {

// Triangles the chunk math knows of, so the products skip work that is zero or unused:
//   lower_a: A is lower triangular (A[i][p] = 0 for p > i, so k ≥ m): row i sums p ≤ i only.
//            Exactly the full product (the skipped terms are +0).
//   lower_c: only C[i][j] for j ≤ i is wanted; entries above the diagonal are left unspecified.
enum class Triangle { none, lower_a, lower_c };

enum class GemmPath { ref, avx2, avx512 };
GemmPath best_gemm_path();                // chosen once by CPUID
bool gemm_path_available(GemmPath path);  // the CPU can run it

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
              double beta, double* C, int ldc, Triangle shape = Triangle::none);
void gemm_f64_ref(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
                  double beta, double* C, int ldc);

void gemm_f32(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
              float* C, int ldc);
// The same on a given path (tests cover every path the CPU has); the path must be available.
void gemm_f64_on(GemmPath path, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
                 int ldb, double beta, double* C, int ldc, Triangle shape = Triangle::none);
void gemm_f32_on(GemmPath path, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc);
void gemm_f32_ref(int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc);

}  // namespace kiln::engine::cpu
