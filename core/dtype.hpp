// dtype: the element types every module names the same way: RPC's wire, the collectives,
// actor messages and training. The values are stable (they travel in RPC frames, docs/
// rpc-wire.md) and only ever grow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace troupe {

/// Element types. Stable values: they travel on the wire.
enum class dtype : std::uint8_t {
  uint8 = 0,
  int8 = 1,
  int16 = 2,
  int32 = 3,
  int64 = 4,
  float16 = 5,
  bfloat16 = 6,
  float32 = 7,
  float64 = 8,
  boolean = 9,
};

/// Bytes per element; 0 for a value outside the enum. Inline: collectives ask per operation.
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::uint8:
    case dtype::int8:
    case dtype::boolean:
      return 1;
    case dtype::int16:
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int32:
    case dtype::float32:
      return 4;
    case dtype::int64:
    case dtype::float64:
      return 8;
  }
  return 0;
}
/// "float32", "bfloat16", "int64", "bool", ...; "invalid" for a value outside the enum.
std::string_view to_string(dtype t) noexcept;
/// True when `raw` names a dtype value.
bool is_valid_dtype(std::uint8_t raw) noexcept;
/// True for float16, bfloat16, float32 and float64.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}

/// The dtype of a C++ element type (uint8_t, int8_t, int16_t, int32_t, int64_t, float,
/// double, bool). float16 and bfloat16 have no C++ type here: name them explicitly.
template <class T>
constexpr dtype dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return dtype::float32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::float64;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return dtype::int8;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return dtype::int16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype::int64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype::uint8;
  else if constexpr (std::is_same_v<T, bool>)
    return dtype::boolean;
  else
    static_assert(sizeof(T) == 0, "no dtype for this element type; name the dtype explicitly");
}

}  // namespace troupe
