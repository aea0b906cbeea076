#include <cuda_runtime_api.h>

#include <troupe/core/cuda_runtime.hpp>

namespace troupe {

bool built_with_cuda() noexcept { return true; }

expected<int> cuda_device_count() {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky per-thread error
    return make_error(errc::unavailable, "no CUDA device is usable: ", cudaGetErrorName(rc), " (",
                      cudaGetErrorString(rc),
                      "); check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or use CPU devices");
  }
  if (count == 0)
    return make_error(errc::unavailable,
                      "the CUDA runtime sees no device; check "
                      "CUDA_VISIBLE_DEVICES or use CPU devices");
  return count;
}

}  // namespace troupe
