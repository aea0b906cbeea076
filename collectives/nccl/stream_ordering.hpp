// Ordering an operation between the caller's stream and the group's own stream with
// events, behind a small interface so that the sequence can be checked without a GPU.
#pragma once

#include <functional>
#include <memory>

#include "core/expected.hpp"

namespace troupe::collectives {

class stream_api {
 public:
  using event = void*;
  using stream = void*;
  virtual ~stream_api() = default;
  virtual expected<event> create_event() = 0;
  virtual void destroy_event(event e) noexcept = 0;
  /// Marks the current end of `s`'s queue with `e`.
  virtual expected<void> record(event e, stream s) = 0;
  /// Makes work queued on `s` from now on wait for `e`.
  virtual expected<void> wait(stream s, event e) = 0;
  /// True once everything before `e` ran; an error if the device failed.
  virtual expected<bool> query(event e) = 0;
};

/// The CUDA runtime implementation (events without timing).
std::unique_ptr<stream_api> make_cuda_stream_api();

/// Queues `launch` on `own` after everything queued on `caller` so far, then makes
/// `caller` wait for it, without blocking the host. Returns the event that marks the
/// operation's end, to be polled and then destroyed by the caller.
expected<stream_api::event> launch_ordered(stream_api& api, stream_api::stream caller,
                                           stream_api::stream own,
                                           const std::function<expected<void>()>& launch);

}  // namespace troupe::collectives
