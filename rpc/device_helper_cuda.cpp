#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include <troupe/rpc/detail/block_pool.hpp>
#include <troupe/rpc/detail/ipc_record.hpp>
#include <troupe/rpc/device_helper.hpp>

namespace troupe::rpc {

namespace {

error cuda_error(cudaError_t e, std::string_view what, device d) {
  return make_error(errc::unavailable, what, " on ", d, " failed: ", cudaGetErrorName(e), " (",
                    cudaGetErrorString(e), ")");
}

// What the helper keeps per device: a non-blocking stream for its copies, and pools of
// pinned host buffers (512 MiB cached: a send's staging block and a receive's landing
// block can be alive at once) and device buffers (256 MiB cached), created on first use
// and kept for the process.
struct device_state {
  cudaStream_t stream = nullptr;
  std::shared_ptr<detail::block_pool> pinned;
  std::shared_ptr<detail::block_pool> memory;
};

constexpr std::size_t max_cached_pinned = std::size_t{512} << 20;
constexpr std::size_t max_cached_device = std::size_t{256} << 20;

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
        if (auto e = cudaMallocHost(&p, n); e != cudaSuccess)
          return cuda_error(e, "cudaMallocHost", d);
        return p;
      },
      [](void* p) { cudaFreeHost(p); }, max_cached_pinned);
  st.memory = detail::block_pool::make(
      [d](std::size_t n) -> expected<void*> {
        if (auto e = cudaSetDevice(d.index()); e != cudaSuccess)
          return cuda_error(e, "cudaSetDevice", d);
        void* p = nullptr;
        if (auto e = cudaMalloc(&p, n); e != cudaSuccess) return cuda_error(e, "cudaMalloc", d);
        return p;
      },
      [index](void* p) {
        cudaSetDevice(index);
        cudaFree(p);
      },
      max_cached_device);
  return &states->emplace(index, std::move(st)).first->second;
}

// An event that is destroyed with its scope.
struct scoped_event {
  cudaEvent_t ev = nullptr;
  ~scoped_event() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

// Copies on the helper's stream once `ready` has happened, and waits for exactly that
// copy through an event: the calling thread (a worker or user thread, never an I/O thread)
// blocks; no stream or device is synchronized as a whole. The current device is `d`.
expected<void> copy_after(cudaEvent_t ready, void* dst, const void* src, std::size_t n,
                          cudaMemcpyKind kind, device d, cudaStream_t helper) {
  if (auto e = cudaStreamWaitEvent(helper, ready, 0); e != cudaSuccess)
    return cuda_error(e, "ordering the copy after the producer's event", d);
  if (auto e = cudaMemcpyAsync(dst, src, n, kind, helper); e != cudaSuccess)
    return cuda_error(e, "cudaMemcpyAsync", d);
  scoped_event done;
  if (auto e = cudaEventCreateWithFlags(&done.ev, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_error(e, "cudaEventCreate", d);
  auto rec = cudaEventRecord(done.ev, helper);
  auto sync = rec == cudaSuccess ? cudaEventSynchronize(done.ev) : rec;
  if (sync != cudaSuccess) return cuda_error(sync, "waiting for a tensor copy", d);
  return ok();
}

// copy_after every operation queued so far on `producer` (null: the legacy default
// stream, which also orders after every blocking stream).
expected<void> ordered_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                            device d, cudaStream_t helper, cudaStream_t producer) {
  if (auto e = cudaSetDevice(d.index()); e != cudaSuccess) return cuda_error(e, "cudaSetDevice", d);
  scoped_event ready;
  if (auto e = cudaEventCreateWithFlags(&ready.ev, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_error(e, "cudaEventCreate", d);
  if (auto e = cudaEventRecord(ready.ev, producer); e != cudaSuccess)
    return cuda_error(e, "recording the producer stream's event", d);
  return copy_after(ready.ev, dst, src, n, kind, d, helper);
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

std::shared_ptr<std::byte> receive_buffer(device dev, std::size_t bytes) noexcept {
  if (!dev.is_cuda() || bytes < receive_buffer_min) return nullptr;
  static const int devices = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }();
  if (dev.index() >= devices) return nullptr;  // place_incoming reports it
  try {
    auto st = state_for(dev.index());
    if (!st) return nullptr;
    auto block = (*st)->pinned->get(bytes);
    if (!block) return nullptr;
    auto* p = static_cast<std::byte*>(block->get());
    return std::shared_ptr<std::byte>(std::move(*block), p);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
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

namespace {

// cuMemGetAddressRange from the driver, found through the runtime (troupe links libcudart
// only): the base and size of the allocation holding a device pointer.
using address_range_fn = int (*)(unsigned long long*, std::size_t*, unsigned long long);

address_range_fn address_range() {
  static address_range_fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return address_range_fn{nullptr};
    return reinterpret_cast<address_range_fn>(p);
  }();
  return fn;
}

// What a loan keeps alive on the lender's side: the tensor (its owner) and the event the
// receiver waits on.
struct lent_tensor {
  tensor source;
  cudaEvent_t event = nullptr;
  ~lent_tensor() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

}  // namespace

expected<ipc_loan> lend_through_ipc(const tensor& t, device target, std::uint64_t id) {
  const device d = t.dev();
  auto unsupported = [&](std::string_view what, cudaError_t e) {
    return make_error(errc::unsupported, "cannot lend ", t, " through CUDA IPC: ", what,
                      " failed: ", cudaGetErrorName(e));
  };
  if (!d.is_cuda() || !t.is_contiguous() || t.nbytes() == 0)
    return make_error(errc::unsupported, "only contiguous, non-empty GPU tensors are lent");
  auto range = address_range();
  if (range == nullptr)
    return make_error(errc::unsupported, "the driver has no cuMemGetAddressRange");
  if (auto e = cudaSetDevice(d.index()); e != cudaSuccess) return unsupported("cudaSetDevice", e);
  unsigned long long base = 0;
  std::size_t size = 0;
  const auto ptr = reinterpret_cast<unsigned long long>(t.data());
  if (range(&base, &size, ptr) != 0 || ptr < base || ptr + t.nbytes() > base + size)
    return make_error(errc::unsupported, "the allocation holding ", t, " is unknown to the driver");
  detail::ipc_record r;
  cudaIpcMemHandle_t mh;
  if (auto e = cudaIpcGetMemHandle(&mh, reinterpret_cast<void*>(base)); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it for the staging path
    return unsupported("cudaIpcGetMemHandle", e);
  }
  auto keep = std::make_shared<lent_tensor>();
  keep->source = t;
  if (auto e =
          cudaEventCreateWithFlags(&keep->event, cudaEventDisableTiming | cudaEventInterprocess);
      e != cudaSuccess)
    return unsupported("cudaEventCreateWithFlags(interprocess)", e);
  if (auto e = cudaEventRecord(keep->event, static_cast<cudaStream_t>(t.stream()));
      e != cudaSuccess)
    return unsupported("recording the producer stream's event", e);
  cudaIpcEventHandle_t eh;
  if (auto e = cudaIpcGetEventHandle(&eh, keep->event); e != cudaSuccess)
    return unsupported("cudaIpcGetEventHandle", e);
  static_assert(sizeof mh == 64 && sizeof eh == 64);
  r.pid = static_cast<std::int32_t>(::getpid());
  r.source_device = d.index();
  r.loan_id = id;
  r.offset = ptr - base;
  r.base = base;
  r.event = reinterpret_cast<std::uint64_t>(keep->event);
  r.type = t.type();
  r.shape = t.shape();
  std::memcpy(r.mem_handle.data(), &mh, 64);
  std::memcpy(r.event_handle.data(), &eh, 64);
  auto record = detail::encode_ipc_record(r, target);
  if (!record) return std::move(record).error();
  return ipc_loan{std::move(*record), std::move(keep)};
}

expected<tensor> receive_through_ipc(const tensor& record) {
  auto r = detail::decode_ipc_record(record);
  if (!r) return std::move(r).error();
  const device target = record.dev();
  auto refused = [&](std::string_view what, cudaError_t e) {
    return make_error(errc::unavailable, "receiving a GPU tensor from process ", r->pid,
                      " through CUDA IPC on ", target, ": ", what, " failed: ", cudaGetErrorName(e),
                      " (", cudaGetErrorString(e),
                      "); if these workers cannot share GPU memory, "
                      "set rpc_backend_options::cuda_ipc = false on the sender");
  };
  auto st = state_for(target.index());
  if (!st) return std::move(st).error();
  const std::size_t n = r->nbytes();
  auto mem = (*st)->memory->get(n == 0 ? 1 : n);
  if (!mem) return std::move(mem).error();
  if (auto e = cudaSetDevice(target.index()); e != cudaSuccess) return refused("cudaSetDevice", e);
  const bool same_process = r->pid == static_cast<std::int32_t>(::getpid());
  void* base = reinterpret_cast<void*>(r->base);
  cudaEvent_t ready = reinterpret_cast<cudaEvent_t>(r->event);
  struct opened {
    void* base = nullptr;
    cudaEvent_t event = nullptr;
    ~opened() {
      if (base != nullptr) cudaIpcCloseMemHandle(base);
      if (event != nullptr) cudaEventDestroy(event);
    }
  } o;
  if (!same_process) {
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, r->event_handle.data(), 64);
    if (auto e = cudaIpcOpenEventHandle(&o.event, eh); e != cudaSuccess)
      return refused("cudaIpcOpenEventHandle", e);
    cudaIpcMemHandle_t mh;
    std::memcpy(&mh, r->mem_handle.data(), 64);
    if (auto e = cudaIpcOpenMemHandle(&o.base, mh, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      o.base = nullptr;
      return refused("cudaIpcOpenMemHandle", e);
    }
    base = o.base;
    ready = o.event;
  }
  const void* src = static_cast<const std::byte*>(base) + r->offset;
  TROUPE_TRY(
      copy_after(ready, mem->get(), src, n, cudaMemcpyDeviceToDevice, target, (*st)->stream));
  void* p = mem->get();
  return tensor::wrap(p, r->type, r->shape, target, {}, std::move(*mem));
}

}  // namespace troupe::rpc
