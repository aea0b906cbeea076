// device_map: which local device sends to which device on one peer worker, and
// device_maps: one such map per peer, keyed by the peer's name.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>

#include <troupe/core/device.hpp>
#include <troupe/core/expected.hpp>

namespace troupe {

/// A map from devices of this worker (sources) to devices of one target worker.
/// A source has at most one target; entries are kept and iterated in source order
/// (cpu first, then cuda devices by index). Whether two sources share a target is not
/// refused here: that is a group-level rule checked by `validate_device_maps`.
class device_map {
 public:
  using container = std::map<device, device>;
  using const_iterator = container::const_iterator;

  device_map() = default;

  /// Maps `source` to `target`. Setting a pair that is already present is a no-op;
  /// mapping a source that already has a different target is an invalid_argument error
  /// that names the source and both targets, and leaves the map unchanged.
  expected<void> set(device source, device target);

  /// The target of `source`, or nullopt when the source is not mapped.
  std::optional<device> find(device source) const;
  bool contains(device source) const { return entries_.contains(source); }

  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  const_iterator begin() const noexcept { return entries_.begin(); }
  const_iterator end() const noexcept { return entries_.end(); }

  friend bool operator==(const device_map&, const device_map&) = default;

 private:
  container entries_;
};

/// Device maps of one worker, keyed by target worker name (iterated in name order).
using device_maps = std::map<std::string, device_map>;

/// The map read backwards: target -> source. If two sources share a target (a map that
/// `validate_device_maps` refuses), the smaller source is kept. For a map whose targets
/// are distinct, `invert(invert(m)) == m`.
device_map invert(const device_map& m);

/// "{cuda:0 -> cuda:1, cpu -> cpu}" style text, entries in source order ("{}" if empty).
std::string to_string(const device_map& m);
std::ostream& operator<<(std::ostream& os, const device_map& m);

/// "{w1: {cuda:0 -> cuda:1}, w2: {}}", targets in name order.
std::string to_string(const device_maps& maps);

/// "[cuda:0, cuda:1]", in the order given.
std::string to_string(std::span<const device> devices);

}  // namespace troupe
