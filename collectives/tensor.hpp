// tensor_view: the minimal, non-owning description of a buffer that a collective reads or
// writes: a data pointer, an element type, an element count and the device it lives on.
// The caller keeps the memory alive until the operation's work handle completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/device.hpp"
#include "core/expected.hpp"

namespace troupe::collectives {

/// Element types a collective can carry. Stable values.
enum class dtype : std::uint8_t {
  float32 = 0,
  float64,
  float16,
  bfloat16,
  int32,
  int64,
  uint8,
};

/// Size of one element in bytes.
std::size_t element_size(dtype t) noexcept;
/// "float32", "bfloat16", ...
std::string_view to_string(dtype t) noexcept;
/// True for float32, float64, float16 and bfloat16.
bool is_floating(dtype t) noexcept;

/// The dtype of a C++ element type (float, double, int32_t, int64_t, uint8_t).
template <class T>
constexpr dtype dtype_of() noexcept;

/// How a reduction combines values.
enum class reduce_op : std::uint8_t { sum = 0, avg, min, max, product };
std::string_view to_string(reduce_op op) noexcept;

/// A non-owning view of `numel` elements of `type` at `data` on `where`.
struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::float32;
  std::size_t numel = 0;
  device where = device::cpu();

  std::size_t nbytes() const noexcept { return numel * element_size(type); }
  /// Elements [offset, offset + count) as a view of their own.
  tensor_view slice(std::size_t offset, std::size_t count) const noexcept {
    return {static_cast<std::byte*>(data) + offset * element_size(type), type, count, where};
  }

  /// A CPU view of a contiguous span of a supported element type.
  template <class T>
  static tensor_view of(std::span<T> s) noexcept {
    return {const_cast<void*>(static_cast<const void*>(s.data())),
            dtype_of<std::remove_const_t<T>>(), s.size(), device::cpu()};
  }
};

/// Checks that `t` is usable: non-null data unless empty, and on the expected device kind.
expected<void> check_tensor(const tensor_view& t, std::string_view what, bool want_cuda);

// Half-precision helpers (round to nearest even), used by the CPU reductions and tests.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;

template <class T>
constexpr dtype dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return dtype::float32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::float64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype::int64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype::uint8;
  else
    static_assert(sizeof(T) == 0, "no dtype for this element type; build the view by hand");
}

}  // namespace troupe::collectives
