// What the running CPU can execute, read once from CPUID (the kernel tables dispatch on it).
#pragma once

#include <string>

namespace kiln::engine::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false;
  bool has_avx2_set() const { return avx2 && fma && f16c; }
  bool has_avx512_set() const { return has_avx2_set() && avx512f && avx512bw && avx512vl; }
};

const CpuFeatures& cpu_features();  // thread-safe; computed on first call
std::string cpu_features_string();  // e.g. "avx2 fma f16c" for logs and bench tables

}  // namespace kiln::engine::cpu
