#include <troupe/core/cuda_runtime.hpp>

namespace troupe {

bool built_with_cuda() noexcept { return false; }

expected<int> cuda_device_count() {
  return make_error(errc::unavailable,
                    "troupe was built without CUDA; reconfigure with CUDA installed "
                    "(CUDAToolkit_ROOT) and -DTROUPE_WITH_CUDA=ON to use GPUs");
}

}  // namespace troupe
