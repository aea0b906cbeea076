// What the members of a gloo group tell each other before they connect: the address each
// binds, its host, and what it asks of the hierarchical path. Internal to collectives/gloo.
#pragma once

#include <string>
#include <vector>

#include <troupe/collectives/gloo/hierarchical.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives {

/// The address this member's device binds and the others connect to: TROUPE_GLOO_HOST
/// when set, else this process's address for its job (core/net_address.hpp). Collective
/// over the members of `g` through `setup` (namespaced for the group): every member
/// publishes its address with its host and its gloo_hier::member_choice, which land in
/// `choices` (index: group rank; left empty in a group of one). Fails when no address can
/// be chosen, the store fails or a member does not answer within the group's timeout, a
/// record is malformed, or a loopback address would be used across hosts (naming the
/// member and what to set), before any connection is tried.
expected<std::string> choose_address(store& setup, const process_group& g,
                                     std::vector<gloo_hier::member_choice>& choices);

}  // namespace troupe::collectives
