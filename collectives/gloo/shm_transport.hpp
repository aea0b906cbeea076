// The shared-memory transport of a gloo group (transport.hpp): every member on one host,
// one segment among them (shared_memory.hpp) for allreduce, broadcast, allgather,
// reduce_scatter (when its output does not overlap its input) and barrier; the rest goes
// over the group's TCP pairs. Internal to collectives/gloo.
#pragma once

#include <memory>

#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/tcp_transport.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_transport {

/// Collective over the members, through `s` (namespaced for this group): opens a segment
/// among them with `o` (TROUPE_GLOO_SHM and TROUPE_GLOO_SHM_SLOT applied here) and
/// returns the transport over it and `tcp`; nullptr when the members cannot share memory
/// (gloo_shm::segment::open says why in the log), for the group to keep to `tcp`. Fails
/// when the store fails or a member does not answer within `o.timeout`.
expected<std::shared_ptr<transport>> open_shared_memory(store& s, gloo_shm::open_options o,
                                                        std::shared_ptr<tcp> tcp);

}  // namespace troupe::collectives::gloo_transport
