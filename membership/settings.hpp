// The environment settings the membership module reads. See core/setting.hpp and
// docs/membership.md.
#pragma once

#include <troupe/core/setting.hpp>

namespace troupe::settings {

inline constexpr setting heartbeat_timeout{
    "TROUPE_HEARTBEAT_TIMEOUT", "10s",
    "how long a member's heartbeat may stay unchanged before the others declare it dead and "
    "agree on an epoch without it, so that a stopped or cut-off worker is noticed within it "
    "(docs/membership.md); as `500ms`, `10s` or seconds; a bad value is reported and ignored"};
inline constexpr setting heartbeat_interval{
    "TROUPE_HEARTBEAT_INTERVAL", "the timeout / 10",
    "how often each member of the job's membership writes its heartbeat and reads the "
    "others'; as `100ms`, `1s` or seconds, below the heartbeat timeout; a bad value is "
    "reported and ignored"};

/// The membership module's settings, in the order of the generated table.
setting_list membership_settings();

}  // namespace troupe::settings
