// What the gloo group asks of the operating system, kept apart from the collectives:
// signals, scheduling of Gloo's event-loop thread and the send buffers of same-host
// connections. Internal to collectives/gloo. Each function is best effort: a refusal is
// logged at debug level and the group runs as it would without it.
#pragma once

#include <sys/types.h>

#include <vector>

namespace gloo {
class Context;
}

namespace troupe::collectives::gloo_os {

/// Once per process, a SIGPIPE left at its default action is set to ignored (a handler
/// the program installed is kept), so that a write to a dead peer fails with EPIPE
/// instead of killing the process.
void ignore_sigpipe_once();

/// The ids of this process's threads, sorted (from /proc/self/task).
std::vector<pid_t> thread_ids();

/// Moves the threads started between two thread_ids() snapshots (`before`, `after`: the
/// creation of Gloo's TCP device) to SCHED_BATCH, unless TROUPE_GLOO_LOOP_BATCH=0.
void batch_loop_threads(const std::vector<pid_t>& before, const std::vector<pid_t>& after);

/// Gives the group's same-host TCP connections of `ctx` the small send buffer of
/// gloo_sockets::local_sndbuf_from_env() (collectives/gloo/local_sockets.hpp says why).
void size_local_send_buffers(gloo::Context& ctx);

}  // namespace troupe::collectives::gloo_os
