// AVX-512 kernel table. Not written yet: this CPU family (the 2-core AMD EPYC dev machines) has
// no AVX-512, so a path here could not be tested; kernels_best() falls back to AVX2.
#include "engine/cpu/matmul.h"

namespace kiln::engine::cpu {

const KernelTable* kernels_avx512() { return nullptr; }

}  // namespace kiln::engine::cpu
