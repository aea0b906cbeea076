// flat_views: several tensors of one dtype and device seen as one flat buffer for a
// single collective. When the tensors already lie back to back in memory (in any order),
// the buffer is that memory and nothing is copied; otherwise a host buffer is packed
// before the collective and unpacked after it (CPU tensors only).
#pragma once

#include <cstddef>
#include <vector>

#include <troupe/collectives/tensor.hpp>

namespace troupe::training {

class flat_views {
 public:
  /// `parts` must share dtype and device. CUDA tensors that are not contiguous are
  /// errc::unsupported (give them one contiguous allocation).
  static expected<flat_views> make(std::vector<tensor_view> parts);

  flat_views() = default;
  flat_views(flat_views&&) noexcept = default;
  flat_views& operator=(flat_views&&) noexcept = default;
  flat_views(const flat_views&) = delete;
  flat_views& operator=(const flat_views&) = delete;
  /// The flat buffer: the tensors' own memory when contiguous, else the host copy.
  tensor_view view() const noexcept { return view_; }
  bool in_place() const noexcept { return in_place_; }
  std::size_t numel() const noexcept { return view_.numel; }
  const std::vector<tensor_view>& parts() const noexcept { return parts_; }
  /// Copies the parts into the buffer (nothing when in place).
  void pack();
  /// Copies the buffer back into the parts (nothing when in place).
  void unpack();

 private:
  std::vector<tensor_view> parts_;
  std::vector<std::byte> copy_;
  tensor_view view_;
  bool in_place_ = false;
};

/// Fills `t` (a CPU tensor of a floating dtype) with zeros / multiplies it by `factor`.
void fill_zero(const tensor_view& t);
expected<void> scale(const tensor_view& t, double factor);

}  // namespace troupe::training
