#include "engine/backend_info.h"

namespace kiln::engine {

#ifdef KILN_HAVE_CUDA
namespace cuda {
int device_count();  // engine/cuda/device.cu
}
bool cuda_compiled() { return true; }
int cuda_device_count() { return cuda::device_count(); }
#else
bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
#endif

}  // namespace kiln::engine
