#include <troupe/collectives/nccl/watchdog.hpp>

namespace troupe::collectives {

watchdog_verdict watchdog_poll(std::deque<pending_op>& pending, clock::time_point now,
                               const std::function<expected<bool>(void*)>& query,
                               const expected<void>& async) {
  watchdog_verdict v;
  auto fail_rest = [&](troupe::error e) {
    v.cause = std::move(e);
    while (!pending.empty()) {
      v.failed.push_back(std::move(pending.front()));
      pending.pop_front();
    }
  };
  while (!pending.empty()) {
    auto& op = pending.front();
    auto done = query(op.done_event);
    if (!done) {
      fail_rest(make_error(done.error().code(), "the device failed: ", done.error().message()));
      return v;
    }
    if (*done) {
      v.finished.push_back(std::move(op));
      pending.pop_front();
      continue;
    }
    if (now >= op.deadline) {
      fail_rest(
          make_error(errc::timeout, "it did not finish within ", format_duration(op.timeout)));
      return v;
    }
    break;  // operations finish in launch order on one stream
  }
  // A communicator error fails everything still pending, even what has not timed out.
  if (!async) fail_rest(async.error());
  return v;
}

}  // namespace troupe::collectives
