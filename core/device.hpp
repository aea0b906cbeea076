// Device: where a tensor lives. "cpu" or "cuda:N".
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>

namespace troupe {

enum class device_type : std::uint8_t { cpu = 0, cuda = 1 };

/// A device identity. Ordered: cpu first, then cuda devices by index.
class device {
 public:
  /// The CPU.
  constexpr device() = default;
  /// The CPU.
  static constexpr device cpu() { return device(); }
  /// cuda:index; a negative index is an invalid_argument error.
  static expected<device> cuda(int index);
  /// Reads "cpu", "cuda:N", or a bare "N" (meaning cuda:N, as device maps often write).
  /// The error quotes the text and shows the accepted forms.
  static expected<device> parse(std::string_view text);

  /// CPU or CUDA.
  constexpr device_type type() const noexcept { return type_; }
  /// The CUDA index; -1 for the CPU.
  constexpr int index() const noexcept { return index_; }
  /// Whether it is the CPU.
  constexpr bool is_cpu() const noexcept { return type_ == device_type::cpu; }
  /// Whether it is a CUDA device.
  constexpr bool is_cuda() const noexcept { return type_ == device_type::cuda; }

  /// "cpu" or "cuda:N", as parse() reads it.
  std::string to_string() const;

  /// CPU first, then CUDA devices by index.
  friend constexpr auto operator<=>(const device&, const device&) = default;

 private:
  constexpr device(device_type t, int i) : type_(t), index_(i) {}
  device_type type_ = device_type::cpu;
  int index_ = -1;
};

std::ostream& operator<<(std::ostream& os, const device& d);

}  // namespace troupe

/// Hashes a device, so it can key unordered containers.
template <>
struct std::hash<troupe::device> {
  /// The hash of the index (-1 for the CPU).
  std::size_t operator()(const troupe::device& d) const noexcept {
    return std::hash<int>()(d.is_cpu() ? -1 : d.index());
  }
};
