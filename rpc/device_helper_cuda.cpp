#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "rpc/detail/block_pool.hpp"
#include "rpc/device_helper.hpp"

namespace troupe::rpc {

namespace {

error cuda_error(cudaError_t e, std::string_view what, device d) {
  return make_error(errc::unavailable, what, " on ", d, " failed: ", cudaGetErrorName(e), " (",
                    cudaGetErrorString(e), ")");
}

// What the helper keeps per device: a non-blocking stream for its copies, and pools of
// pinned host and device buffers (256 MiB cached each), created on first use and kept for
// the process.
struct device_state {
  cudaStream_t stream = nullptr;
  std::shared_ptr<detail::block_pool> pinned;
  std::shared_ptr<detail::block_pool> memory;
};

constexpr std::size_t max_cached_per_pool = std::size_t{256} << 20;

expected<device_state*> state_for(int index) {
  static std::mutex mu;
  static std::map<int, device_state>* states = new std::map<int, device_state>();  // outlives exit
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = states->find(index); it != states->end()) return &it->second;
  const device d = *device::cuda(index);
  device_state st;
  if (auto e = cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking); e != cudaSuccess)
    return cuda_error(e, "cudaStreamCreateWithFlags", d);
  st.pinned = detail::block_pool::make(
      [d](std::size_t n) -> expected<void*> {
        void* p = nullptr;
        if (auto e = cudaMallocHost(&p, n); e != cudaSuccess) return cuda_error(e, "cudaMallocHost", d);
        return p;
      },
      [](void* p) { cudaFreeHost(p); }, max_cached_per_pool);
  st.memory = detail::block_pool::make(
      [d](std::size_t n) -> expected<void*> {
        if (auto e = cudaSetDevice(d.index()); e != cudaSuccess) return cuda_error(e, "cudaSetDevice", d);
        void* p = nullptr;
        if (auto e = cudaMalloc(&p, n); e != cudaSuccess) return cuda_error(e, "cudaMalloc", d);
        return p;
      },
      [index](void* p) {
        cudaSetDevice(index);
        cudaFree(p);
      },
      max_cached_per_pool);
  return &states->emplace(index, std::move(st)).first->second;
}

// An event that is destroyed with its scope.
struct scoped_event {
  cudaEvent_t ev = nullptr;
  ~scoped_event() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

// Copies on the helper's stream after every operation queued so far on `producer` (null:
// the legacy default stream, which also orders after every blocking stream), and waits for
// exactly that copy through an event: the calling thread (a worker or user thread, never an
// I/O thread) blocks; no stream or device is synchronized as a whole.
expected<void> ordered_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, device d,
                            cudaStream_t helper, cudaStream_t producer) {
  if (auto e = cudaSetDevice(d.index()); e != cudaSuccess) return cuda_error(e, "cudaSetDevice", d);
  scoped_event ready, done;
  if (auto e = cudaEventCreateWithFlags(&ready.ev, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_error(e, "cudaEventCreate", d);
  if (auto e = cudaEventRecord(ready.ev, producer); e != cudaSuccess)
    return cuda_error(e, "recording the producer stream's event", d);
  if (auto e = cudaStreamWaitEvent(helper, ready.ev, 0); e != cudaSuccess)
    return cuda_error(e, "ordering the copy after the producer stream", d);
  if (auto e = cudaMemcpyAsync(dst, src, n, kind, helper); e != cudaSuccess)
    return cuda_error(e, "cudaMemcpyAsync", d);
  if (auto e = cudaEventCreateWithFlags(&done.ev, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_error(e, "cudaEventCreate", d);
  auto rec = cudaEventRecord(done.ev, helper);
  auto sync = rec == cudaSuccess ? cudaEventSynchronize(done.ev) : rec;
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
  auto st = state_for(t.dev().index());
  if (!st) return std::move(st).error();
  const std::size_t n = t.nbytes();
  auto host = (*st)->pinned->get(n == 0 ? 1 : n);
  if (!host) return std::move(host).error();
  TROUPE_TRY(ordered_copy(host->get(), t.data(), n, cudaMemcpyDeviceToHost, t.dev(), (*st)->stream,
                          static_cast<cudaStream_t>(t.stream())));
  void* p = host->get();
  return tensor::wrap(p, t.type(), t.shape(), device::cpu(), {}, std::move(*host));
}

expected<tensor> upload_to_device(const tensor& t, device target) {
  if (!target.is_cuda()) return t;
  auto st = state_for(target.index());
  if (!st) return std::move(st).error();
  const std::size_t n = t.nbytes();
  auto mem = (*st)->memory->get(n == 0 ? 1 : n);
  if (!mem) return std::move(mem).error();
  // The source is host memory: nothing on a stream produces it.
  TROUPE_TRY(ordered_copy(mem->get(), t.data(), n, cudaMemcpyHostToDevice, target, (*st)->stream,
                          (*st)->stream));
  void* p = mem->get();
  return tensor::wrap(p, t.type(), t.shape(), target, {}, std::move(*mem));
}

}  // namespace troupe::rpc
