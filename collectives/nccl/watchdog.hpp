// The watchdog's decision logic, free of CUDA so that it can be tested on any machine.
// The group's watchdog thread polls the pending operations in launch order: finished ones
// complete their work; an asynchronous communicator error, a device error or a passed
// deadline ends the group, failing that operation and every one after it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collectives/work.hpp>

namespace troupe::collectives {

struct pending_op {
  /// Launch order among all of the group's operations (collectives and transfers alike).
  std::uint64_t ticket = 0;
  std::uint64_t seq = 0;
  /// The other rank of a point-to-point transfer, else -1.
  int peer = -1;
  std::string what;
  duration timeout{};
  clock::time_point deadline;
  void* done_event = nullptr;
  work::completer completer;
};

struct watchdog_verdict {
  /// Operations whose end was reached, in order.
  std::vector<pending_op> finished;
  /// Set when the group must be aborted: the cause and every operation it fails.
  std::optional<troupe::error> cause;
  std::vector<pending_op> failed;
};

/// One poll over `pending` (consumed from the front). `query(event)` says whether an
/// operation's end was reached; `async` is the communicator's asynchronous state.
watchdog_verdict watchdog_poll(std::deque<pending_op>& pending, clock::time_point now,
                               const std::function<expected<bool>(void*)>& query,
                               const expected<void>& async);

}  // namespace troupe::collectives
