// The hierarchical transport of a gloo group (transport.hpp): members on several hosts,
// shared memory within each host and TCP between them (hierarchical.hpp) for allreduces
// of at least the group's threshold and for reduce_scatter through them; everything else,
// smaller allreduces included, goes over the group's TCP pairs. Internal to
// collectives/gloo.
#pragma once

#include <memory>
#include <span>

#include <troupe/collectives/gloo/hierarchical.hpp>
#include <troupe/collectives/gloo/tcp_transport.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_transport {

/// Collective over the members, through `s` (namespaced for this group): when the
/// members span hosts, some host has two or more of them and none turned the path off
/// (`choices`: what each member asked for at connect, index: group rank; rank 0's
/// threshold holds), opens gloo_hier::path with `o` and returns the transport over it and
/// `tcp`. nullptr when the path does not apply or a host's members cannot share memory,
/// for the group to try shared memory on one host, then TCP. Fails when the store fails
/// or a member does not answer within `o.timeout`.
expected<std::shared_ptr<transport>> open_hierarchical(
    const std::shared_ptr<store>& s, std::span<const gloo_hier::member_choice> choices,
    gloo_hier::open_options o, std::shared_ptr<tcp> tcp);

}  // namespace troupe::collectives::gloo_transport
