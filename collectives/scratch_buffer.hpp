// scratch_buffer: a few elements of memory on a device for small control collectives
// (the counters of Join, flags exchanged once per training step): host memory for the
// CPU, device memory for a CUDA device (built with CUDA only). Owns its memory.
#pragma once

#include <cstddef>
#include <memory>

#include <troupe/collectives/tensor.hpp>

namespace troupe::collectives {

class scratch_buffer {
 public:
  /// `numel` elements of `type` on `where`, zero-filled. A CUDA device in a build without
  /// CUDA is errc::unavailable; a failed allocation names the device and the size.
  static expected<scratch_buffer> make(device where, dtype type, std::size_t numel);

  scratch_buffer() = default;
  scratch_buffer(scratch_buffer&&) noexcept = default;
  scratch_buffer& operator=(scratch_buffer&&) noexcept = default;

  /// The whole buffer as a view for a collective.
  tensor_view view() const noexcept { return view_; }
  /// Copies `nbytes()` bytes from host memory at `src` into the buffer (synchronously).
  expected<void> write(const void* src) const;
  /// Copies the buffer into host memory at `dst` (synchronously, after queued device work).
  expected<void> read(void* dst) const;

 private:
  struct owner;
  std::shared_ptr<owner> memory_;
  tensor_view view_;
};

}  // namespace troupe::collectives
