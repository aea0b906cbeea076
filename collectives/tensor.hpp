// What collectives add to the shared tensor vocabulary (core/tensor.hpp: dtype,
// tensor_view, tensor): reduction operations, the check every operation makes of its
// buffers, and the half-precision conversions the CPU reductions use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <troupe/core/device.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>

namespace troupe::collectives {

/// How a reduction combines values.
enum class reduce_op : std::uint8_t { sum = 0, avg, min, max, product };
std::string_view to_string(reduce_op op) noexcept;

/// Checks that `t` is usable: non-null data unless empty, and on the expected device kind.
expected<void> check_tensor(const tensor_view& t, std::string_view what, bool want_cuda);

// Half-precision helpers (round to nearest even), used by the CPU reductions and tests.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;

}  // namespace troupe::collectives
