// Membership events: what an agent tells its listeners when the group changes.
#pragma once

#include <cstdint>
#include <functional>

#include <troupe/core/error.hpp>
#include <troupe/core/worker_info.hpp>

namespace troupe::rpc {

enum class membership_change : std::uint8_t {
  /// A worker joined the (dynamic) group.
  joined,
  /// A worker left the group in an orderly way (leave() or shutdown()).
  left,
  /// A worker's connection broke without it leaving: it died or became unreachable.
  /// In a dynamic group it is also removed from the membership. Under an outside
  /// membership (rpc_backend_options::membership_tag): the worker was expel()led, and the
  /// reason is that membership's (membership_changed, naming the epoch).
  failed,
  /// Under an outside membership only: a member's connection broke. It stays a member
  /// (calls to it fail with connection_lost) until the membership takes it out, which
  /// comes as `failed`.
  unreachable,
};

struct membership_event {
  membership_change change = membership_change::joined;
  worker_info worker;
  /// For `failed`: what broke (connection_lost naming the worker).
  error reason;
};

/// Called on an agent thread after the membership has changed; must be short and must not
/// block or call back into the agent synchronously.
using membership_listener = std::function<void(const membership_event&)>;

}  // namespace troupe::rpc
