// Which compute backends this build of the engine carries.
#pragma once

namespace kiln::engine {

// True when the engine was compiled with the CUDA backend (KILN_CUDA=ON and nvcc present).
bool cuda_compiled();

// Number of CUDA devices visible at run time; 0 without CUDA or without a GPU.
int cuda_device_count();

}  // namespace kiln::engine
