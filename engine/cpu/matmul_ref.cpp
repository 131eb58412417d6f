// Reference matrix products: plain loops over one row and one token at a time, never optimized.
// They define what the SIMD kernels compute (same integer sums, same scale algebra); they are
// also the portable fallback on CPUs without AVX2.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"

namespace kiln::engine::cpu {

namespace {

void matmul_f32_ref(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                    int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < x.n; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      const auto* wr = reinterpret_cast<const float*>(w.row(r));
      const float* xt = x.f32 + t * x.k;
      float acc = 0.0f;
      for (int64_t i = 0; i < w.cols; ++i) acc += wr[i] * xt[i];
      y[t * ldy + r] = acc;
    }
}

void matmul_bf16_ref(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                     int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < x.n; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      const auto* wr = reinterpret_cast<const uint16_t*>(w.row(r));
      const float* xt = x.f32 + t * x.k;
      float acc = 0.0f;
      for (int64_t i = 0; i < w.cols; ++i) acc += bf16_to_fp32(wr[i]) * xt[i];
      y[t * ldy + r] = acc;
    }
}

// The quantized products' definition, shared by every kernel table (see matmul_quant_avx2.cpp):
// exact int32 block sums s_b, folded into eight partial sums a_j (block b into a_{b mod 8}) by
// fma(float(s_b), d_b, a_j) [q4: then fma(m_b, float(Σ_block q_x), a_j)] in ascending b, then
// y = d_x · (((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))). Fixing the order makes an
// output independent of the kernel and of how many tokens share the call.
float fold_partial_sums(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

void matmul_q8_ref(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                   int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / kQuantBlock;
  for (int64_t t = 0; t < x.n; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      const auto* d = reinterpret_cast<const uint16_t*>(w.row(r));
      const auto* q = reinterpret_cast<const int8_t*>(w.row(r) + 2 * nb);
      const int16_t* xq = x.q16.q + t * x.k;
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int64_t j = 0; j < kQuantBlock; ++j) {
          const int64_t slot = quant_slot(nb, b, j);
          s += q[slot] * xq[slot];
        }
        a[b % 8] = std::fma(static_cast<float>(s), fp16_to_fp32(d[b]), a[b % 8]);
      }
      y[t * ldy + r] = x.q16.d[t] * fold_partial_sums(a);
    }
}

void matmul_q4_ref(const WeightMatrix& w, const MatmulInput& x, float* y, int64_t ldy,
                   int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / kQuantBlock;
  for (int64_t t = 0; t < x.n; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      const auto* d = reinterpret_cast<const uint16_t*>(w.row(r));
      const uint16_t* m = d + nb;
      const uint8_t* q = w.row(r) + 4 * nb;
      const int16_t* xq = x.q16.q + t * x.k;
      const int32_t* xs = x.q16.block_sum + t * nb;
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int64_t j = 0; j < kQuantBlock; ++j) {
          const int64_t slot = quant_slot(nb, b, j);
          s += q4_value(q, nb, slot) * xq[slot];
        }
        a[b % 8] = std::fma(static_cast<float>(s), fp16_to_fp32(d[b]), a[b % 8]);
        a[b % 8] = std::fma(fp16_to_fp32(m[b]), static_cast<float>(xs[b]), a[b % 8]);
      }
      y[t * ldy + r] = x.q16.d[t] * fold_partial_sums(a);
    }
}

void quantize_f32_ref(const float* src, uint8_t* dst, int64_t cols) {
  quantize_row_ref(WeightFormat::f32, src, dst, cols);
}
void quantize_bf16_ref(const float* src, uint8_t* dst, int64_t cols) {
  quantize_row_ref(WeightFormat::bf16, src, dst, cols);
}

const KernelTable kRefTable = {
    "ref",
    {matmul_f32_ref, matmul_bf16_ref, matmul_q8_ref, matmul_q4_ref},
    {quantize_f32_ref, quantize_bf16_ref, quantize_row_q8_ref, quantize_row_q4_ref},
    quantize_acts_ref,
};

const KernelTable& choose_best() {
  // KILN_CPU_KERNELS=ref|avx2|avx512 pins a table (debugging, A/B timing); unknown or
  // unsupported values fall back to the automatic choice.
  if (const char* env = std::getenv("KILN_CPU_KERNELS")) {
    const std::string_view v(env);
    if (v == "ref") return kRefTable;
    if (v == "avx2" && kernels_avx2()) return *kernels_avx2();
    if (v == "avx512" && kernels_avx512()) return *kernels_avx512();
  }
  if (const KernelTable* t = kernels_avx512()) return *t;
  if (const KernelTable* t = kernels_avx2()) return *t;
  return kRefTable;
}

}  // namespace

const KernelTable& kernels_ref() { return kRefTable; }

const KernelTable& kernels_best() {
  static const KernelTable& best = choose_best();
  return best;
}

MatmulInput prepare_input(const KernelTable& kt, WeightFormat format, const float* x, int64_t n,
                          int64_t k, ActQ16Buffer& buf) {
  MatmulInput in;
  in.n = n;
  in.k = k;
  if (is_block_format(format))
    in.q16 = buf.quantize(x, n, k, kt.quantize_acts);
  else
    in.f32 = x;
  return in;
}

void matmul(const KernelTable& kt, const WeightMatrix& w, const float* x, int64_t n, float* y,
            int64_t ldy, ActQ16Buffer& buf) {
  const MatmulInput in = prepare_input(kt, w.format, x, n, w.cols, buf);
  kt.matmul[static_cast<int>(w.format)](w, in, y, ldy, 0, w.rows);
}

void quantize_matrix(const KernelTable& kt, WeightFormat format, const float* src, int64_t rows,
                     int64_t cols, uint8_t* dst) {
  const size_t stride = row_bytes(format, cols);
  for (int64_t r = 0; r < rows; ++r)
    kt.quantize[static_cast<int>(format)](src + r * cols, dst + r * stride, cols);
}

}  // namespace kiln::engine::cpu
