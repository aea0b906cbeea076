#include "collectives/nccl/stream_ordering.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "collectives/nccl/nccl_errors.hpp"

namespace troupe::collectives {

namespace {

// Events are reused: every operation takes two, and creating and destroying them costs
// more host time than the rest of an enqueue. A returned event is only ever one whose
// waits were already queued or that was seen complete, so re-recording it is safe. At most
// max_cached are kept; the rest are destroyed.
class cuda_stream_api final : public stream_api {
 public:
  ~cuda_stream_api() override {
    for (auto e : free_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  expected<event> create_event() override {
    {
      std::lock_guard lk(mu_);
      if (!free_.empty()) {
        auto e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    if (auto r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r != cudaSuccess)
      return cuda_error(r, "cudaEventCreateWithFlags");
    return static_cast<event>(e);
  }
  void destroy_event(event e) noexcept override {
    if (!e) return;
    {
      std::lock_guard lk(mu_);
      if (free_.size() < max_cached) {
        free_.push_back(e);
        return;
      }
    }
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
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

 private:
  static constexpr std::size_t max_cached = 1024;
  std::mutex mu_;
  std::vector<event> free_;
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
