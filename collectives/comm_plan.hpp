// comm_plan: what a communicator-based backend (nccl) does with its communicator when the
// membership epoch moves, decided on the host from the two epochs alone (no CUDA here).
// The rules are in docs/membership.md, "NCCL communicators across epochs":
//
//   same members, same order, healthy, nothing pending  -> keep
//   only departures                                      -> shrink (ncclCommShrink)
//   any arrival, a reordering, the same members after a
//   fault, or no shrink available                        -> recreate (new unique id)
//
// Every member of the new epoch computes the same plan from the same two epochs; the
// local facts (pending work, a communicator error, an old library) are agreed through the
// store before anyone acts (collectives/elastic_group.cpp), so that all shrink or all
// re-create.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/membership/epoch.hpp>

namespace troupe::collectives {

/// What becomes of the old epoch's communicator.
enum class comm_action {
  /// The new epoch has the same members in the same order and the communicator is
  /// healthy with nothing pending: it serves the new epoch as it is (the nccl group splits
  /// it with one color, so that the new epoch's group has a communicator of its own).
  keep,
  /// Members only left: the survivors call ncclCommShrink on the old communicator,
  /// excluding the old ranks of those who left; the new ranks are the survivors' old ranks
  /// made dense in order, which is what membership::next_epoch gives them.
  shrink,
  /// Someone came, the survivors' order changed, the same members had pending work or an
  /// error (nobody to exclude), or the old communicator cannot be shrunk:
  /// the old one is aborted (or destroyed) and every member joins a new one made from a
  /// fresh unique id published under `unique_id_key`.
  recreate,
};

/// "keep", "shrink", "recreate".
std::string_view to_string(comm_action a) noexcept;

/// The local facts about the old communicator when the epoch moved.
struct comm_state {
  /// Work was queued or running on it (it was failed at once when the epoch moved).
  bool pending_work = false;
  /// It reported an asynchronous error, or an operation on it failed.
  bool in_error = false;
  /// It still exists (not aborted or destroyed); only a live one can be shrunk.
  bool live = true;
  /// The NCCL library in this process, as ncclGetVersion reports it (e.g. 22809 for
  /// 2.28.9); 0 when unknown. ncclCommShrink needs at least 2.27.
  int library_version = 0;
};

/// The first NCCL version code with ncclCommShrink (2.27.0).
inline constexpr int nccl_shrink_min_version = 22700;

/// Whether an NCCL library of `version_code` (ncclGetVersion) has ncclCommShrink.
bool shrink_supported(int version_code) noexcept;

/// "2.28.9" for 22809 (and "2.8.4" for the old scheme's 2804).
std::string format_nccl_version(int version_code);

/// The decision for one move from `before` to `after`, the same on every member.
struct comm_plan {
  /// What to do with the old communicator.
  comm_action action = comm_action::recreate;
  /// The epoch the old communicator served.
  std::uint64_t from_epoch = 0;
  /// The epoch to move to.
  std::uint64_t to_epoch = 0;
  /// Old ranks whose member is not in the new epoch, ascending (ncclCommShrink's
  /// excludeRanksList for a shrink).
  std::vector<int> excluded;
  /// For each old rank, its rank in the new epoch, or -1 when it left.
  std::vector<int> new_rank;
  /// Those who left, as membership::describe names them, in old rank order.
  std::vector<std::string> left;
  /// Those who came, as membership::describe names them, in new rank order.
  std::vector<std::string> came;
  /// Abort the old communicator's operations first: NCCL_SHRINK_ABORT for a shrink,
  /// ncclCommAbort rather than finalize-and-destroy for a re-create. Set when it had
  /// pending work or an error.
  bool abort_first = false;
  /// For a re-create: the store key (relative to the job's root store) under which the new
  /// epoch's rank 0 publishes the fresh unique id, scoped to the new epoch's group.
  std::string unique_id_key;
  /// One line: why this action, e.g. "only departures: shrink excluding old ranks [1]".
  std::string reason;
};

/// The plan for moving the communicator of group `old_group` (epoch `before`) to the group
/// `new_group` (epoch `after`), given the local state `old`. Members are matched by name and
/// incarnation (a replacement with the same name is a departure and an arrival). Pure and
/// deterministic. Fails with invalid_argument when `after` is not newer than `before`, or
/// when an epoch's ranks are not its positions (members[i].rank == i).
expected<comm_plan> plan_comm_change(const membership::epoch& before,
                                     const membership::epoch& after, const comm_state& old,
                                     std::string_view new_group);

/// "epoch 3 -> 4: shrink (only departures: ...); left: ...; came: -".
std::string describe(const comm_plan& p);

}  // namespace troupe::collectives
