// troupe::launch: runs a function in N child processes on this machine, each with the
// environment troupe-run would give a worker (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, TROUPE_STORE_URL, ...), and reports the first child that fails.
//
//   auto r = troupe::launch([] { train(); }, {.nprocs = 4});
//   if (!r) std::cerr << r.error() << "\n";   // "rank 2 failed: <its message>"
//
// - Children are forked from the calling thread; `fn` runs in each and its return ends
//   the child (exit code 0), an error or exception fails it with the message sent back.
// - The first child to fail wins: the others get SIGTERM, then SIGKILL after stop_grace,
//   and launch() returns errc::user_error naming that rank and carrying its message
//   (or its exit code or signal when it died without one).
// - With nprocs == 1, `fn` runs in the calling process, with the same variables set for
//   the duration of the call (and the previous values put back afterwards).
// - Children die with the calling thread (PR_SET_PDEATHSIG), so none outlives it.
#pragma once

#include <functional>
#include <string>
#include <type_traits>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe {

struct launch_config {
  /// Processes to run; >= 1.
  int nprocs = 1;
  std::string master_addr = "127.0.0.1";
  /// 0: a free port.
  int master_port = 0;
  /// TROUPE_RUN_ID; empty: a fresh one.
  std::string run_id;
  /// Start an embedded TCP store (loopback, free port) and give its URL to the children
  /// as TROUPE_STORE_URL (only when nprocs > 1).
  bool start_store = true;
  /// Time the other children get between SIGTERM and SIGKILL after one fails.
  duration stop_grace = std::chrono::seconds(5);
};

namespace detail {
expected<void> launch_impl(const std::function<expected<void>()>& fn, const launch_config& config);
}  // namespace detail

/// Runs `fn` (returning void or expected<void>; it may throw) in config.nprocs processes.
template <class F>
expected<void> launch(F&& fn, const launch_config& config = {}) {
  if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
    return detail::launch_impl(
        [&]() -> expected<void> {
          fn();
          return ok();
        },
        config);
  } else {
    return detail::launch_impl([&]() -> expected<void> { return fn(); }, config);
  }
}

}  // namespace troupe
