// Durations, deadlines and the process-wide default timeout.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>

namespace troupe {

using clock = std::chrono::steady_clock;
using duration = std::chrono::milliseconds;

/// Parses "250ms", "30s", "5m", "1h" or a bare number of seconds ("30").
/// Negative or malformed values are an invalid_argument error that quotes the input.
expected<duration> parse_duration(std::string_view text);

/// "250ms", "30s", "5m": the shortest exact unit.
std::string format_duration(duration d);

/// The timeout used when a caller gives none. 5 minutes unless TROUPE_DEFAULT_TIMEOUT
/// (a duration as parse_duration reads it) or set_default_timeout() says otherwise.
duration default_timeout();

/// Replaces the default timeout for the whole process; must be positive.
expected<void> set_default_timeout(duration d);

/// A point in time after which an operation gives up. Cheap to copy.
class deadline {
 public:
  /// A deadline `d` from now. A huge `d` saturates instead of overflowing.
  static deadline after(duration d);
  /// A deadline that never expires.
  static deadline never() { return deadline(clock::time_point::max()); }
  /// The deadline at `tp`.
  explicit deadline(clock::time_point tp) : at_(tp) {}

  /// When it expires.
  clock::time_point time_point() const noexcept { return at_; }
  /// Whether it has passed.
  bool expired() const noexcept { return clock::now() >= at_; }
  /// Time left, zero once expired.
  duration remaining() const noexcept;

 private:
  clock::time_point at_;
};

}  // namespace troupe
