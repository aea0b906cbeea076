#include "collectives/nccl/stream_ordering.hpp"

#include <cuda_runtime_api.h>

#include "collectives/nccl/nccl_errors.hpp"

namespace troupe::collectives {

namespace {

class cuda_stream_api final : public stream_api {
 public:
  expected<event> create_event() override {
    cudaEvent_t e = nullptr;
    if (auto r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r != cudaSuccess)
      return cuda_error(r, "cudaEventCreateWithFlags");
    return static_cast<event>(e);
  }
  void destroy_event(event e) noexcept override {
    if (e) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  expected<void> record(event e, stream s) override {
    if (auto r = cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s));
        r != cudaSuccess)
      return cuda_error(r, "cudaEventRecord");
    return ok();
  }
  expected<void> wait(stream s, event e) override {
    if (auto r = cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0);
        r != cudaSuccess)
      return cuda_error(r, "cudaStreamWaitEvent");
    return ok();
  }
  expected<bool> query(event e) override {
    auto r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    return cuda_error(r, "cudaEventQuery");
  }
};

}  // namespace

std::unique_ptr<stream_api> make_cuda_stream_api() { return std::make_unique<cuda_stream_api>(); }

expected<stream_api::event> launch_ordered(stream_api& api, stream_api::stream caller,
                                           stream_api::stream own,
                                           const std::function<expected<void>()>& launch) {
  auto before = api.create_event();
  if (!before) return std::move(before).error();
  struct guard {
    stream_api& api;
    stream_api::event e;
    ~guard() { api.destroy_event(e); }
  } g{api, *before};
  TROUPE_TRY(api.record(*before, caller));
  TROUPE_TRY(api.wait(own, *before));
  TROUPE_TRY(launch());
  auto after = api.create_event();
  if (!after) return std::move(after).error();
  if (auto r = api.record(*after, own); !r) {
    api.destroy_event(*after);
    return std::move(r).error();
  }
  if (auto r = api.wait(caller, *after); !r) {
    api.destroy_event(*after);
    return std::move(r).error();
  }
  return *after;
}

}  // namespace troupe::collectives
