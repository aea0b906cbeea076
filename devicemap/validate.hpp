// validate_device_maps: the group-wide check of every worker's device record, run once
// all records have been exchanged and before any reverse map or device list is built.
#pragma once

#include <cstdint>
#include <span>

#include <troupe/core/expected.hpp>
#include <troupe/devicemap/worker_device_info.hpp>

namespace troupe {

/// How the group was formed; it decides what can be checked about absent workers.
enum class group_kind : std::uint8_t {
  /// Every worker is present at init; a map naming anyone else is a mistake.
  static_group,
  /// Workers join and leave; a map may name a worker that has not joined yet, and then
  /// nothing about that worker's devices can be checked.
  dynamic_group,
};

/// Checks the records of all workers of a group. Returns the first violation as an
/// errc::invalid_argument error whose message names the worker, the target worker, the
/// offending entry ("cuda:0 -> cuda:7") and the valid range or list, and says what to
/// change; the error's worker() is the worker whose record is at fault.
///
/// The checks, in the order they run (the first failure is the one reported):
///  1. For each record in the given order: its name is not used by an earlier record,
///     and its device count is not negative.
///  2. For each record in the given order: its device list (when given) holds no device
///     twice, and then every listed device is valid for its device count (cpu always;
///     cuda:i iff 0 <= i < device_count). Entries are checked in list order.
///  3. For each record in the given order:
///     a. static groups only: every target name of its maps (in name order) is the name
///        of a record;
///     b. then for each target in name order, with entries in source order:
///        - no two sources share a target device;
///        - every source is in the worker's device list when one is given, otherwise
///          valid for the worker's device count (cpu is valid on either side of a map
///          and never needs listing: device lists name GPUs);
///        - every target device is in the target's device list when the target is known
///          and gave a non-empty list, otherwise valid for the target's device count
///          when the target is known; a target that is unknown (dynamic groups) is not
///          checked.
/// Reporting the first failure in this fixed order makes the error identical on every
/// worker, which all run the same check on the same records.
expected<void> validate_device_maps(std::span<const worker_device_info> all, group_kind kind);

/// True when `d` is cpu, or cuda:i with 0 <= i < device_count.
bool is_valid_device(device d, int device_count) noexcept;

}  // namespace troupe
