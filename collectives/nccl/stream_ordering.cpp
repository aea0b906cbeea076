#include <troupe/collectives/nccl/stream_ordering.hpp>

#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>
#include <vector>

#include <troupe/collectives/nccl/nccl_errors.hpp>

namespace troupe::collectives {

namespace {

// Events are reused: every operation takes one, and creating and destroying them costs
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
      for (auto it = retained_.begin(); it != retained_.end(); ++it) {
        if (it->first != e) continue;
        if (--it->second == 0) retained_.erase(it);
        return;
      }
      if (free_.size() < max_cached) {
        free_.push_back(e);
        return;
      }
    }
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void retain(event e) noexcept override {
    if (!e) return;
    std::lock_guard lk(mu_);
    for (auto& [r, extra] : retained_)
      if (r == e) {
        ++extra;
        return;
      }
    retained_.emplace_back(e, 1);
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
  // Events with owners beyond the first, and how many more destroy_event calls each
  // needs (a sequencer's tail: one or two at a time, so a vector).
  std::vector<std::pair<event, int>> retained_;
};

}  // namespace

std::unique_ptr<stream_api> make_cuda_stream_api() { return std::make_unique<cuda_stream_api>(); }

expected<stream_api::event> stream_sequencer::launch(
    stream_api::stream caller, const std::function<expected<void>(stream_api::stream)>& launch) {
  // Another stream than the last operation's: wait for that operation's end first.
  if (tail_ != nullptr && caller != last_) TROUPE_TRY(api_.wait(caller, tail_));
  TROUPE_TRY(launch(caller));
  auto end = api_.create_event();
  if (!end) return std::move(end).error();
  if (auto r = api_.record(*end, caller); !r) {
    api_.destroy_event(*end);
    return std::move(r).error();
  }
  api_.retain(*end);
  api_.destroy_event(tail_);
  tail_ = *end;
  last_ = caller;
  return *end;
}

}  // namespace troupe::collectives
