// elastic_group: a process group that follows the job's membership epochs
// (docs/membership.md, "Process groups that follow epochs").
//
// For each epoch it builds a group of that epoch's members, ranks as in the epoch, under the
// store prefix `<name>/epoch-<n>/`. When the epoch changes, the group of the old epoch is
// aborted: its pending and later work fails at once with errc::membership_changed, naming
// the new epoch and who left or came (name, rank, host). A work that failed because its
// group broke (a peer died before the others agreed it is gone) is held until the epoch
// that explains it, up to `grace`, and then fails with membership_changed too. Callers
// then call rebuild(), every member of the new epoch together, and redo the work there.
//
//   auto eg = elastic_group::make(service, store, {});
//   auto v = (*eg)->rebuild(30s);                     // collective over the epoch
//   auto r = v->group->allreduce(t, {reduce_op::sum, 60s}).wait(70s);
//   if (!r && r.error().code() == errc::membership_changed) v = (*eg)->rebuild(30s);
//
// Threads: the service's watcher aborts old groups (on_epoch); one thread of this object
// ends held works at their grace. Every blocking call takes a timeout.
#pragma once

#include <memory>
#include <string>

#include <troupe/collectives/process_group.hpp>
#include <troupe/membership/service.hpp>

namespace troupe::collectives {

struct elastic_options {
  /// The prefix of this job's elastic groups in the store; epoch n's group is
  /// `<name>/epoch-<n>`. Unique among the job's elastic groups.
  std::string name = "elastic";
  /// The backend of each epoch's group; empty for default_backend(). Only backends that
  /// implement process_group::abort can follow epochs (gloo and nccl do).
  std::string backend = "gloo";
  /// Bounds building one epoch's group (exchanging addresses, connecting, the check
  /// allreduce). A member that dies while the others wait for it (in the store, or in a
  /// pair's connect) ends the build when the epoch without it arrives; one that is stopped
  /// after connecting holds it until this bound.
  duration build_timeout = std::chrono::seconds(30);
  /// How long a work that failed because its group broke waits for the epoch that explains
  /// it before failing with its own error; zero: the service's heartbeat timeout, plus
  /// one second for agreeing on the epoch.
  duration grace = duration::zero();
};

/// A process group that follows the epochs of a membership::service; see the top of this
/// file. All methods are safe to call from any thread.
class elastic_group {
 public:
  /// One epoch and this process's group in it.
  struct view {
    membership::epoch epoch;
    /// Ranks and size as in `epoch`; null before the first rebuild().
    std::shared_ptr<process_group> group;
  };

  /// Follows `members` (which must outlive this object and have joined) with groups whose
  /// keys live in `s` under `o.name`. Builds nothing yet: call rebuild(). Fails with
  /// invalid_argument for a null service or store, an empty name, or a backend that is
  /// not registered.
  static expected<std::unique_ptr<elastic_group>> make(std::shared_ptr<membership::service> members,
                                                       std::shared_ptr<store> s,
                                                       elastic_options o = {});

  elastic_group(const elastic_group&) = delete;
  elastic_group& operator=(const elastic_group&) = delete;
  /// Same as shutdown(5s).
  ~elastic_group();

  /// The group built last, with its epoch. Its group may already be aborted (the epoch
  /// moved on): then its work fails with membership_changed and rebuild() gives the next.
  view current() const;

  /// The newest epoch this process knows of (it may not have a group yet).
  membership::epoch latest() const;

  /// Builds the group of the newest epoch, with every other member of it (they call
  /// rebuild() too); returns it at once when it is built already. When the epoch moves
  /// during the build, builds the newer one instead. Fails with membership_changed when
  /// this process is not in the newest epoch (declared dead, or left), with timeout when
  /// the group could not be built within `timeout` (naming the epoch and the step), or
  /// with shut_down.
  expected<view> rebuild(duration timeout);

  /// Waits until an epoch newer than `than` is known, up to `timeout`; returns it. Fails
  /// with timeout, shut_down, or the service's sticky error.
  expected<membership::epoch> wait_for_change(std::uint64_t than, duration timeout);

  /// Aborts the current group (its work fails with shut_down), stops following the epochs
  /// and stops the thread, within `timeout`. Idempotent. Does not leave the membership.
  void shutdown(duration timeout);

  /// Internal: the shared state of the group and of the groups it hands out.
  struct state;

 private:
  explicit elastic_group(std::shared_ptr<state> st);
  std::shared_ptr<state> state_;
};

}  // namespace troupe::collectives
