// CUDA backend entry: device discovery. Kernels live one file per op family beside this one.
#include <cuda_runtime.h>

namespace kiln::engine::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;  // no driver / no GPU is not an error here
  return count;
}

}  // namespace kiln::engine::cuda
