// The troupe-run agent: one per node. Forms the world with the other nodes, starts this
// node's workers, watches them, restarts the group after a failure (up to --max-restarts)
// or when the world re-forms, forwards stop signals, and reports the first failure.
#pragma once

#include <troupe/launcher/config.hpp>

namespace troupe::launcher {

/// Runs the job until it succeeds (returns 0), fails (1, with the failing worker's report
/// on stderr) or is stopped by a signal (128 + the signal). Call from the main thread:
/// workers are tied to the lifetime of the thread that starts them.
int run_agent(const run_config& config);

/// A fresh random run id (16 hex digits).
std::string fresh_run_id();

/// A TCP port that was free on this host a moment ago.
int pick_free_port();

}  // namespace troupe::launcher
