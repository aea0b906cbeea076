#include <troupe/collectives/tensor.hpp>

#include <bit>
#include <cstring>

namespace troupe::collectives {

std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::avg:
      return "avg";
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
    case reduce_op::product:
      return "product";
  }
  return "unknown";
}

expected<void> check_tensor(const tensor_view& t, std::string_view what, bool want_cuda) {
  if (element_size(t.type) == 0)
    return make_error(errc::invalid_argument, what, " has an unknown dtype (",
                      static_cast<int>(t.type), ")");
  if (t.numel > 0 && t.data == nullptr)
    return make_error(errc::invalid_argument, what, " has ", t.numel,
                      " elements but a null data pointer");
  if (want_cuda != t.where.is_cuda())
    return make_error(errc::invalid_argument, what, " lives on ", t.where.to_string(),
                      " but this backend needs ", want_cuda ? "CUDA" : "CPU",
                      " tensors; move it or pick another backend");
  return ok();
}

float half_to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    // A NaN comes out quiet, as the F16C instructions make it (cpu_reduce.cpp uses both).
    bits = sign | 0x7f800000u | man << 13 | (man != 0 ? 0x400000u : 0u);
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t man = x & 0x7fffffu;
  // A NaN keeps the top of its payload and comes out quiet, as with the F16C instructions.
  if (exp == 0xff)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u | man >> 13 : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    int shift = 14 - e;
    std::uint32_t half = man >> shift;
    std::uint32_t rem = man & ((1u << shift) - 1);
    std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = static_cast<std::uint32_t>(e) << 10 | man >> 13;
  std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: fine
  return static_cast<std::uint16_t>(sign | half);
}

float bfloat16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t float_to_bfloat16(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

}  // namespace troupe::collectives
