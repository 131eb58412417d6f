// Small dense double-precision matrix products for the chunked gated delta rule (delta_rule.cpp),
// whose chunk math runs in double (see there why). Row-major with leading dimensions:
//   C[m][n] = beta·C + alpha · A[m][k] · B[k][n]        (beta = 0: C is only written)
// gemm_f64 picks the AVX2+FMA kernel when the CPU has it (6×8 register tiles; 4×8 and single
// rows at the edge), else the reference. Twin: gemm_f64_ref (plain loops), compared in
// tests/engine/kernel_gemm_f64_test.cpp.
#pragma once

namespace kiln::engine::cpu {

// Triangles the chunk math knows of, so the products skip work that is zero or unused:
//   lower_a: A is lower triangular (A[i][p] = 0 for p > i, so k ≥ m): row i sums p ≤ i only.
//            Exactly the full product (the skipped terms are +0).
//   lower_c: only C[i][j] for j ≤ i is wanted; entries above the diagonal are left unspecified.
enum class Triangle { none, lower_a, lower_c };

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb, double beta,
              double* C, int ldc, Triangle shape = Triangle::none);
void gemm_f64_ref(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
                  double beta, double* C, int ldc);

}  // namespace kiln::engine::cpu
