// Finding out which ranks did not arrive. When a group fails, every member that noticed
// announces itself in the store and waits briefly for the others; the members that stay
// silent (dead, or busy outside the group's collectives) are named in the error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collectives/process_group.hpp>

namespace troupe::collectives {

/// How long at most a failing member spends on the roll call: a fifth of the operation's
/// timeout, between 100 ms and 1 s. Backends shorten the transport's timeout by as much.
duration roll_call_budget(duration timeout);

/// The world ranks of the members of `spec` that did not announce a failure within
/// `budget`; nullopt when the store could not be used. `seq` is the failed operation's
/// number, recorded for diagnosis. Keys go under "rollcall/" of `s`, which the backend
/// namespaces per group; a group holds one roll call, as its failure is sticky.
std::optional<std::vector<int>> roll_call(store& s, const group_spec& spec, std::uint64_t seq,
                                          duration budget);

/// "ranks [2] did not arrive", "every rank reached it" or "... are unknown".
std::string describe_missing(const std::optional<std::vector<int>>& missing);

}  // namespace troupe::collectives
