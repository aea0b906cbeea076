// epoch: one numbered view of who is in the job, and the pure rules that turn one epoch into
// the next. The record layout and the agreement built on it are in docs/membership.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>

namespace troupe::membership {

/// One process in the job.
struct member {
  /// Unique within an epoch, no white space, e.g. "worker3".
  std::string name;
  /// The host it runs on, no white space.
  std::string host;
  /// Its process id on that host.
  std::int64_t pid = 0;
  /// A random id made when the process joined: a replacement with the same name differs.
  std::string incarnation;
  /// Its dense rank in the epoch that holds it (its position in the member list).
  int rank = -1;

  /// Same name, host, pid, incarnation and rank.
  friend bool operator==(const member&, const member&) = default;
};

/// "worker3 (rank 3, host h2, pid 4121)": how every message names a member.
std::string describe(const member& m);

/// An epoch: its number and its members in rank order. Epoch 0 is the empty job.
struct epoch {
  /// Grows by exactly one per change.
  std::uint64_t number = 0;
  /// The members, `members[i].rank == i`.
  std::vector<member> members;
  /// One line saying what made this epoch, e.g. "joined worker5 (rank 2, ...)".
  std::string cause;

  /// The member named `name`, or nullptr.
  const member* find(std::string_view name) const;
  /// Whether the member `name` with this incarnation is in the epoch (an empty
  /// `incarnation` matches any).
  bool contains(std::string_view name, std::string_view incarnation = {}) const;
  /// The member names in rank order, comma-separated: "worker0,worker1".
  std::string names() const;
  /// The number of members.
  std::size_t size() const noexcept { return members.size(); }

  /// Same number, members and cause.
  friend bool operator==(const epoch&, const epoch&) = default;
};

/// Which member to remove: a name, and an incarnation (empty: whichever holds the name).
struct member_ref {
  /// The member's name.
  std::string name;
  /// Its incarnation; empty matches whichever member holds the name.
  std::string incarnation;
};

/// A change proposed to the current epoch.
struct epoch_change {
  /// Members to take out (dead or leaving); one already out is skipped.
  std::vector<member_ref> remove;
  /// Members to add (joining), ranks ignored; one already in (same incarnation) is skipped.
  std::vector<member> add;
  /// What made the change, for the next epoch's `cause`.
  std::string cause;
  /// The member that saw what it reports (a death it observed), if any: the change then
  /// applies only to an epoch that still holds the proposer. An epoch without it comes
  /// unchanged: the proposer's view of the others predates that epoch.
  std::optional<member_ref> proposer;
};

/// The epoch after applying `change` to `current`: survivors keep their relative order,
/// joiners follow (several in one change sorted by name), ranks are renumbered 0..n-1 and
/// the number grows by one. When the change changes nothing, returns `current` unchanged
/// (same number). Pure and deterministic. Fails with already_exists when a joiner's name is
/// held by another incarnation that the change does not remove.
expected<epoch> next_epoch(const epoch& current, const epoch_change& change);

/// The record text of `e` (docs/membership.md, "Keys").
std::string encode(const epoch& e);

/// Reads a record written by encode(); protocol_error naming the bad line otherwise.
expected<epoch> decode(std::string_view record);

/// Whether `text` can be a name or host: non-empty, printable, no white space.
bool valid_token(std::string_view text) noexcept;

/// The error for work pending when the epoch moved from `before` to `after`: code
/// membership_changed, naming the new epoch, who left, who came, and the cause.
error membership_changed_error(const epoch& before, const epoch& after);

}  // namespace troupe::membership
