// tensor: a view of n-dimensional data on a device (dtype, shape, strides, bytes) that can
// wrap any framework's buffer. RPC carries tensors outside the serialized arguments: the
// bytes travel in the frame's payload section, written straight from the view's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/expected.hpp"

namespace troupe::rpc {

/// Element types. Stable values: they travel on the wire.
enum class dtype : std::uint8_t {
  u8 = 0, i8, i16, i32, i64, f16, bf16, f32, f64, boolean,
};

/// Bytes per element; 0 for a value outside the enum.
std::size_t element_size(dtype t) noexcept;
/// "f32", "i64", ...
std::string_view to_string(dtype t) noexcept;
/// True when `raw` names a dtype value.
bool is_valid_dtype(std::uint8_t raw) noexcept;

/// A view of tensor data. It owns nothing unless `owner` is set: a view built with `wrap`
/// and no owner must stay valid until every call that sends it has completed (its future
/// is ready). Received tensors always own their memory.
class tensor {
 public:
  tensor() = default;

  /// Wraps `data` (laid out as `shape`, with `strides` in elements, or contiguous when
  /// `strides` is empty). `owner` keeps the memory alive (may be null, see above).
  /// Fails with invalid_argument for a negative dimension, strides of the wrong rank, or
  /// a null pointer with a non-empty shape.
  static expected<tensor> wrap(void* data, dtype type, std::vector<std::int64_t> shape,
                               device dev = device::cpu(),
                               std::vector<std::int64_t> strides = {},
                               std::shared_ptr<void> owner = nullptr);
  /// A new contiguous CPU tensor of zeros.
  static tensor zeros(dtype type, std::vector<std::int64_t> shape);
  /// A CPU tensor holding a copy of `values`.
  template <class T>
  static tensor from(std::span<const T> values, dtype type);

  dtype type() const noexcept { return type_; }
  device dev() const noexcept { return device_; }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Strides in elements; empty when contiguous.
  const std::vector<std::int64_t>& strides() const noexcept { return strides_; }
  std::int64_t numel() const noexcept;
  /// Bytes of the elements (numel * element_size), what goes on the wire.
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * element_size(type_); }
  bool is_contiguous() const noexcept;
  void* data() const noexcept { return data_; }
  template <class T>
  std::span<T> as_span() const {
    return {static_cast<T*>(data_), static_cast<std::size_t>(numel())};
  }
  const std::shared_ptr<void>& owner() const noexcept { return owner_; }

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
  void* stream() const noexcept { return stream_; }

  /// RPC's own use: whether this (u8, host memory) tensor holds a CUDA IPC record that
  /// stands for a GPU tensor lent by a worker on this host (rpc/device_helper.hpp), not
  /// the tensor's bytes; dev() is the device it lands on. Never set on user tensors.
  bool is_ipc_record() const noexcept { return ipc_record_; }
  /// The same view marked (or unmarked) as an IPC record.
  tensor as_ipc_record(bool on = true) const;

  /// Same dtype, shape and element values (device ignored); for tests.
  friend bool same_values(const tensor& a, const tensor& b);

 private:
  void* data_ = nullptr;
  dtype type_ = dtype::u8;
  device device_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::shared_ptr<void> owner_;
  void* stream_ = nullptr;
  bool ipc_record_ = false;
};

std::ostream& operator<<(std::ostream& os, const tensor& t);

/// 64-byte aligned storage of `n` bytes, owned by the returned pointer.
std::shared_ptr<std::byte> allocate_aligned(std::size_t n);

template <class T>
tensor tensor::from(std::span<const T> values, dtype type) {
  tensor t = zeros(type, {static_cast<std::int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size_bytes());
  return t;
}

}  // namespace troupe::rpc
