// The tensor vocabulary every module shares (docs/core.md, "Tensors"):
// - tensor_view: a flat, contiguous, non-owning run of elements (data, dtype, count,
//   device): what a collective reads or writes, what NCCL and Gloo take.
// - tensor: n-dimensional data (dtype, shape, strides in elements, device) that can wrap
//   any framework's buffer, owning its memory when built with `zeros`, `from` or an
//   `owner`. RPC sends and receives it; actor messages carry it.
// A contiguous tensor gives its flat view with `view()`; a view becomes a 1-D tensor with
// `tensor::wrap(view)`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <troupe/core/device.hpp>
#include <troupe/core/dtype.hpp>
#include <troupe/core/expected.hpp>

namespace troupe {

/// A non-owning view of `numel` contiguous elements of `type` at `data` on `where`. The
/// caller keeps the memory alive for as long as the view is used (for a collective, until
/// its work handle completes).
struct tensor_view {
  /// The first element (null only when `numel` is 0).
  void* data = nullptr;
  /// The element type.
  dtype type = dtype::float32;
  /// How many elements, contiguous from `data`.
  std::size_t numel = 0;
  /// Where the memory lives.
  device where = device::cpu();

  /// Bytes of the elements: numel * element_size(type).
  std::size_t nbytes() const noexcept { return numel * element_size(type); }
  /// Elements [offset, offset + count) as a view of their own.
  tensor_view slice(std::size_t offset, std::size_t count) const noexcept {
    return {static_cast<std::byte*>(data) + offset * element_size(type), type, count, where};
  }

  /// A CPU view of a contiguous span of an element type dtype_of knows.
  template <class T>
  static tensor_view of(std::span<T> s) noexcept {
    return {const_cast<void*>(static_cast<const void*>(s.data())),
            dtype_of<std::remove_const_t<T>>(), s.size(), device::cpu()};
  }
};

/// N-dimensional tensor data. It owns nothing unless `owner` is set: a tensor built with
/// `wrap` and no owner must stay valid until every operation that reads it has completed
/// (for an RPC, until its future is ready). Tensors received by RPC own their memory.
class tensor {
 public:
  tensor() = default;

  /// Wraps `data` (laid out as `shape`, with `strides` in elements, or contiguous when
  /// `strides` is empty). `owner` keeps the memory alive (may be null, see above).
  /// Fails with invalid_argument for a dtype outside the enum, a negative dimension or
  /// stride, strides of the wrong rank, or a null pointer with a non-empty shape.
  static expected<tensor> wrap(void* data, dtype type, std::vector<std::int64_t> shape,
                               device dev = device::cpu(), std::vector<std::int64_t> strides = {},
                               std::shared_ptr<void> owner = nullptr);
  /// The 1-D tensor over a flat view's elements (non-owning, like the view).
  static tensor wrap(const tensor_view& v);
  /// A new contiguous CPU tensor of zeros.
  static tensor zeros(dtype type, std::vector<std::int64_t> shape);
  /// A CPU tensor holding a copy of `values`.
  template <class T>
  static tensor from(std::span<const T> values, dtype type);

  /// The element type.
  dtype type() const noexcept { return type_; }
  /// Where the data lives (for a received tensor: where it landed).
  device dev() const noexcept { return device_; }
  /// The dimensions, outermost first; empty for a scalar.
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Strides in elements; empty when contiguous.
  const std::vector<std::int64_t>& strides() const noexcept { return strides_; }
  /// The number of elements: the product of the dimensions (1 for a scalar).
  std::int64_t numel() const noexcept;
  /// Bytes of the elements (numel * element_size), what goes on the wire.
  std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(numel()) * element_size(type_);
  }
  /// True when the elements lie in row-major order without gaps.
  bool is_contiguous() const noexcept;
  /// The first element (host or device memory, see dev()).
  void* data() const noexcept { return data_; }
  /// The elements as a span of T; for contiguous host tensors whose dtype T matches.
  template <class T>
  std::span<T> as_span() const {
    return {static_cast<T*>(data_), static_cast<std::size_t>(numel())};
  }
  /// What keeps the memory alive; null for a view of memory the caller owns.
  const std::shared_ptr<void>& owner() const noexcept { return owner_; }

  /// The flat view of this tensor's elements, for a collective. Fails with
  /// invalid_argument when the tensor is not contiguous (call contiguous() first).
  expected<tensor_view> view() const;
  /// A contiguous CPU copy of a strided CPU view (the same tensor when already contiguous).
  tensor contiguous() const;
  /// The same data labelled with another device (used when a buffer was staged).
  tensor with_device(device d) const;

  /// The CUDA stream (a cudaStream_t) whose queued work produces this GPU tensor's data;
  /// null means the device's legacy default stream. A send copies the data only after
  /// every operation queued on that stream when the call was made (an event recorded there
  /// and waited for by the copy), so a tensor written by a kernel on a non-blocking stream
  /// must name that stream. Not sent over the wire; ignored for CPU tensors.
  tensor with_stream(void* cuda_stream) const;
  /// The stream set by with_stream, or null.
  void* stream() const noexcept { return stream_; }

  /// Same dtype, shape and element values (device ignored); for tests.
  friend bool same_values(const tensor& a, const tensor& b);

 private:
  void* data_ = nullptr;
  dtype type_ = dtype::uint8;
  device device_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::shared_ptr<void> owner_;
  void* stream_ = nullptr;
};

std::ostream& operator<<(std::ostream& os, const tensor& t);

/// 64-byte aligned storage of `n` bytes, owned by the returned pointer. Blocks of 256 KiB
/// and more are recycled through a process-wide cache (at most 512 MiB kept).
std::shared_ptr<std::byte> allocate_aligned(std::size_t n);

template <class T>
tensor tensor::from(std::span<const T> values, dtype type) {
  tensor t = zeros(type, {static_cast<std::int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size_bytes());
  return t;
}

}  // namespace troupe
