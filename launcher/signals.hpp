// The launcher's signals, turned into bytes on a self-pipe so that one poll() loop sees
// worker exits (SIGCHLD) and requests to stop (SIGINT, SIGTERM, SIGHUP) alongside output.
#pragma once

#include <troupe/core/expected.hpp>

namespace troupe::launcher {

/// Installs the handlers (once per process) and returns the pipe's read end.
expected<int> install_signal_pipe();

struct signal_events {
  /// A child changed state.
  bool child = false;
  /// The last stop request received (SIGINT, SIGTERM or SIGHUP), or 0.
  int stop = 0;
};

/// Reads everything pending on the pipe (non-blocking).
signal_events drain_signal_pipe();

/// The first stop request received so far, or 0 (safe from any thread).
int stop_signal_received() noexcept;

/// How many stop requests have arrived (a second one means "stop now").
int stop_signal_count() noexcept;

/// Puts the default handlers back.
void restore_signal_handlers();

}  // namespace troupe::launcher
