// communicator_carry: how the members of a new epoch agree, through the store, that every
// one of them carries its communicator over from the same old epoch (nccl: shrinks it) or
// that all re-create (docs/membership.md, "NCCL communicators across epochs"). Used by
// elastic_group's commit step; private to collectives/.
//
// Before arriving in epoch n's commit counter, a member whose plan keeps or shrinks adds
// itself to `<commit>carry-from-<k>` (k: the epoch of its old communicator), and to
// `<commit>carry-from-<k>-abort` when its plan aborts the old operations first. Once the
// commit is decided every member reads both: all offered -> all shrink (aborting first if
// any asked), otherwise all re-create.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <troupe/collectives/comm_plan.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/membership/epoch.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives {

/// What one member can carry from the group it built last into a new epoch's group.
struct carry_offer {
  /// The old backend group (null when there is none).
  std::shared_ptr<process_group> prev;
  /// Its epoch.
  std::shared_ptr<const membership::epoch> from;
  /// This member's plan; set when `prev` can rebuild natively (rebuild_state() answers).
  std::optional<comm_plan> plan;
  /// The plan keeps or shrinks: this member offers to carry its communicator over.
  bool offers = false;
};

/// The offer of a member whose last group is `prev` (of epoch `from`) for epoch `to`'s
/// group named `group_name`. No plan when there is no old group, it is not older than
/// `to`, or its backend has no native rebuild; a planning error is logged and means no plan.
carry_offer make_carry_offer(std::shared_ptr<process_group> prev,
                             std::shared_ptr<const membership::epoch> from,
                             const membership::epoch& to, const std::string& group_name);

/// Adds `o` to the counters under `commit_prefix` (e.g. "elastic/epoch-4/commit/") when it
/// offers; call before arriving in the commit counter. Each store call bounded by `timeout`.
expected<void> publish_carry(store& s, const std::string& commit_prefix, const carry_offer& o,
                             duration timeout);

/// What the members agreed, read after the commit was decided.
struct carry_agreement {
  /// Every member of the new epoch offered to carry over from the same epoch.
  bool all = false;
  /// One of them asked for the old operations to be aborted first.
  bool abort_first = false;
  /// How many offered.
  std::int64_t offered = 0;
};

/// Reads the counters of `o`'s old epoch under `commit_prefix` for epoch `to` (`o.from`
/// must be set). Each store call bounded by `timeout`.
expected<carry_agreement> agree_carry(store& s, const std::string& commit_prefix,
                                      const membership::epoch& to, const carry_offer& o,
                                      duration timeout);

}  // namespace troupe::collectives
