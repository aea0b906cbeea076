#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "rpc/device_helper.hpp"

namespace troupe::rpc {

namespace {

error cuda_error(cudaError_t e, std::string_view what, device d) {
  return make_error(errc::unavailable, what, " on ", d, " failed: ", cudaGetErrorName(e), " (",
                    cudaGetErrorString(e), ")");
}

// One non-blocking stream per device, created on first use and kept for the process.
expected<cudaStream_t> stream_for(int index) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = streams.find(index); it != streams.end()) return it->second;
  cudaStream_t s = nullptr;
  if (auto e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
    return cuda_error(e, "cudaStreamCreateWithFlags", *device::cuda(index));
  streams.emplace(index, s);
  return s;
}

// Copies on the helper's stream and waits for exactly that copy through an event.
expected<void> copy_and_wait(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, device d) {
  if (auto e = cudaSetDevice(d.index()); e != cudaSuccess) return cuda_error(e, "cudaSetDevice", d);
  auto s = stream_for(d.index());
  if (!s) return std::move(s).error();
  if (auto e = cudaMemcpyAsync(dst, src, n, kind, *s); e != cudaSuccess)
    return cuda_error(e, "cudaMemcpyAsync", d);
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_error(e, "cudaEventCreate", d);
  auto rec = cudaEventRecord(ev, *s);
  auto sync = rec == cudaSuccess ? cudaEventSynchronize(ev) : rec;
  cudaEventDestroy(ev);
  if (sync != cudaSuccess) return cuda_error(sync, "waiting for a tensor copy", d);
  return ok();
}

}  // namespace

bool gpu_copies_available() noexcept {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

expected<tensor> stage_to_host(const tensor& t) {
  if (!t.dev().is_cuda()) return t.contiguous();
  if (!t.is_contiguous())
    return make_error(errc::unsupported, "GPU tensor ", t,
                      " is not contiguous; make it contiguous before sending it");
  void* host = nullptr;
  std::size_t n = t.nbytes();
  if (auto e = cudaMallocHost(&host, n == 0 ? 1 : n); e != cudaSuccess)
    return cuda_error(e, "cudaMallocHost", t.dev());
  std::shared_ptr<void> owner(host, [](void* p) { cudaFreeHost(p); });
  TROUPE_TRY(copy_and_wait(host, t.data(), n, cudaMemcpyDeviceToHost, t.dev()));
  return tensor::wrap(host, t.type(), t.shape(), device::cpu(), {}, std::move(owner));
}

expected<tensor> upload_to_device(const tensor& t, device target) {
  if (!target.is_cuda()) return t;
  if (auto e = cudaSetDevice(target.index()); e != cudaSuccess) return cuda_error(e, "cudaSetDevice", target);
  void* dev = nullptr;
  std::size_t n = t.nbytes();
  if (auto e = cudaMalloc(&dev, n == 0 ? 1 : n); e != cudaSuccess) return cuda_error(e, "cudaMalloc", target);
  std::shared_ptr<void> owner(dev, [](void* p) { cudaFree(p); });
  TROUPE_TRY(copy_and_wait(dev, t.data(), n, cudaMemcpyHostToDevice, target));
  return tensor::wrap(dev, t.type(), t.shape(), target, {}, std::move(owner));
}

}  // namespace troupe::rpc
