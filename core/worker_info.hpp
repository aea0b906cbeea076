// worker_info: a worker's identity in a group, {name, id}.
#pragma once

#include <compare>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>

namespace troupe {

/// A worker's identity in its group: its name and id.
struct worker_info {
  /// Unique in its group; see validate_worker_name for the allowed characters.
  std::string name;
  /// The worker's id (its rank in a static group); -1 until assigned.
  std::int32_t id = -1;

  /// Ordered by name, then id.
  friend auto operator<=>(const worker_info&, const worker_info&) = default;
};

/// Names are 1..128 characters of letters, digits, '_', '-', '.' and ':'. A '/' is not
/// allowed because "worker/actor" addresses a named actor on a worker.
expected<void> validate_worker_name(std::string_view name);

std::ostream& operator<<(std::ostream& os, const worker_info& w);

}  // namespace troupe
