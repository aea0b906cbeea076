// Ordering a communicator's operations on its callers' streams with events, behind a
// small interface so that the sequence can be checked without a GPU.
#pragma once

#include <functional>
#include <memory>

#include <troupe/core/expected.hpp>

namespace troupe::collectives {

class stream_api {
 public:
  using event = void*;
  using stream = void*;
  virtual ~stream_api() = default;
  virtual expected<event> create_event() = 0;
  /// Gives an event back. An event that was retain()ed is given back only by its last
  /// destroy_event.
  virtual void destroy_event(event e) noexcept = 0;
  /// Adds an owner to `e`: one more destroy_event is needed to give it back.
  virtual void retain(event e) noexcept = 0;
  /// Marks the current end of `s`'s queue with `e`.
  virtual expected<void> record(event e, stream s) = 0;
  /// Makes work queued on `s` from now on wait for `e`.
  virtual expected<void> wait(stream s, event e) = 0;
  /// True once everything before `e` ran; an error if the device failed.
  virtual expected<bool> query(event e) = 0;
};

/// The CUDA runtime implementation (events without timing).
std::unique_ptr<stream_api> make_cuda_stream_api();

/// Queues a communicator's operations in one total order across the streams its callers
/// use, with as few stream calls as that order needs. Each operation runs on the caller's
/// stream itself: it starts after the work queued there so far, and the caller's later
/// work waits for it, with no event in between (what a separate stream of the group's own
/// would need four calls for). When an operation comes on another stream than the one
/// before it, that stream first waits for the end of the one before: operations of one
/// communicator never run at once on two streams (NCCL kernels of one communicator on two
/// streams can deadlock). Not thread-safe: the caller serializes launches.
class stream_sequencer {
 public:
  explicit stream_sequencer(stream_api& api) : api_(api) {}
  ~stream_sequencer() { api_.destroy_event(tail_); }
  stream_sequencer(const stream_sequencer&) = delete;
  stream_sequencer& operator=(const stream_sequencer&) = delete;

  /// Queues `launch(caller)` in order as above. Returns the event that marks the
  /// operation's end, to be polled and then destroyed by the caller. On an error nothing
  /// is leaked, and when `launch` itself failed the order is as before the call.
  expected<stream_api::event> launch(
      stream_api::stream caller, const std::function<expected<void>(stream_api::stream)>& launch);

 private:
  stream_api& api_;
  stream_api::stream last_ = nullptr;  // the stream of the operation before
  stream_api::event tail_ = nullptr;   // its end (retained here), null before the first
};

}  // namespace troupe::collectives
