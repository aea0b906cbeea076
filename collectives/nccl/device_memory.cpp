// Device memory for scratch_buffer: allocation, zero-fill and synchronous copies on the
// legacy default stream, which orders them after the collectives the caller waited for.
#include <cuda_runtime_api.h>

#include <troupe/collectives/nccl/nccl_errors.hpp>
#include <troupe/core/expected.hpp>

namespace troupe::collectives::detail {

expected<void*> cuda_alloc_zeroed(int device_index, std::size_t nbytes) {
  if (auto r = cudaSetDevice(device_index); r != cudaSuccess) return cuda_error(r, "cudaSetDevice");
  void* p = nullptr;
  if (auto r = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes); r != cudaSuccess)
    return std::move(cuda_error(r, "cudaMalloc"))
        .with_operation(strcat("scratch buffer of ", nbytes, " bytes on cuda:", device_index));
  if (auto r = cudaMemset(p, 0, nbytes); r != cudaSuccess) {
    (void)cudaFree(p);
    return cuda_error(r, "cudaMemset");
  }
  return p;
}

void cuda_free(void* p) noexcept { (void)cudaFree(p); }

expected<void> cuda_copy(void* dst, const void* src, std::size_t nbytes, bool to_device) {
  auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  if (auto r = cudaMemcpy(dst, src, nbytes, kind); r != cudaSuccess)
    return cuda_error(r, "cudaMemcpy");
  return ok();
}

}  // namespace troupe::collectives::detail
