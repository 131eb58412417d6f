// Small dense double-precision matrix products for the chunked gated delta rule (delta_rule.cpp),
// whose chunk math runs in double (see there why). Row-major with leading dimensions:
//   C[m][n] = beta·C + alpha · A[m][k] · B[k][n]        (beta = 0: C is only written)
// gemm_f64 picks the AVX2+FMA kernel when the CPU has it (4×8 register tiles), else the
// reference. Twin: gemm_f64_ref (plain loops), compared in tests/engine/kernel_gemm_f64_test.cpp.
#pragma once

namespace kiln::engine::cpu {

void gemm_f64(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb, double beta,
              double* C, int ldc);
void gemm_f64_ref(int m, int n, int k, double alpha, const double* A, int lda, const double* B, int ldb,
                  double beta, double* C, int ldc);

}  // namespace kiln::engine::cpu
