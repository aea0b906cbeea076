// What one worker derives from the group's device records: the maps it uses to send
// back to each peer, and the list of devices it must handle.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include <troupe/core/device.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/devicemap/device_map.hpp>
#include <troupe/devicemap/validate.hpp>
#include <troupe/devicemap/worker_device_info.hpp>

namespace troupe {

/// The reverse device maps of worker `my_name`: for each record in `all` whose maps
/// have an entry for `my_name` (even an empty one), that map inverted, keyed by the
/// record's name. reverse[w] maps each of my devices that receives from w to the
/// device of w that sends to it, i.e. the map for sending replies back to w.
/// Meant for records that passed `validate_device_maps`; on a map where two sources share
/// a target, the smaller source is kept (see `invert`). A worker that maps to itself
/// appears in its own reverse maps.
device_maps reverse_device_maps(std::string_view my_name, std::span<const worker_device_info> all);

/// The devices worker `me` handles: its explicit device list when one is given, sorted
/// (cpu first, then by index); otherwise the union of the sources of its own maps and of
/// `reverse` (its own devices on both sides), without cpu, sorted by index.
std::vector<device> build_device_list(const worker_device_info& me, const device_maps& reverse);

/// Everything a worker needs from the device-map exchange.
struct device_setup {
  /// See `reverse_device_maps`.
  device_maps reverse_maps;
  /// See `build_device_list`.
  std::vector<device> devices;

  friend bool operator==(const device_setup&, const device_setup&) = default;
};

/// The init-time step for worker `my_name`: validates `all` (see `validate_device_maps`),
/// then derives its reverse maps and its device list. A validation failure is returned
/// as is; `my_name` missing from `all` is an errc::not_found error.
expected<device_setup> resolve_device_setup(std::string_view my_name,
                                            std::span<const worker_device_info> all,
                                            group_kind kind);

}  // namespace troupe
