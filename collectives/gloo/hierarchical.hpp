// The hierarchical allreduce of a gloo group whose members span hosts. Internal to
// collectives/gloo; used by the thread running the group's current operation only
// (mark_failed() and abort() excepted).
//
// Shared memory needs every member of a group on one host (gloo_shm::segment), so a group
// across hosts would run every allreduce over TCP, between the members of one host too.
// Here the members of each host map a segment of their own, and an allreduce (of at least
// TROUPE_GLOO_HIERARCHICAL_MIN bytes: every one by default) runs in three steps:
//   1. within each host, over shared memory: a reduce-scatter (local rank k gets the host's
//      sum of slice k, in place in its own slice of the tensor), or an allreduce of the whole
//      tensor when the hosts have different member counts or the tensor does not split evenly;
//   2. across hosts: the members with local rank k, one per host, allreduce slice k, every
//      slice at once, over TCP links of their own that the calling thread drives
//      (host_link.hpp): between two hosts one exchange of the slice; between more, a
//      reduce-scatter then an allgather, each a direct exchange with every other host;
//   3. within each host, over shared memory: an allgather of the slices (a broadcast per
//      slice after step 1's allreduce).
// Numerics: every element folds as (host 0's sum) op (host 1's sum) op ..., each host's sum
// in local rank order, so every member gets bit-identical results; floating-point results
// may differ in the last bits from the flat order r0 op r1 op r2 ... of the other paths.
//
// Failure: a step that fails returns an error naming the step and the members it ran
// with; the caller fails the group (marks its host's segment failed, shuts its link and
// closes its TCP connections), which fails the members of its host and, through the
// connections, those of the other hosts at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/direct.hpp>
#include <troupe/collectives/gloo/host_link.hpp>
#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_hier {

/// Allreduces from this size take the path when TROUPE_GLOO_HIERARCHICAL_MIN is not set:
/// every size, as between two simulated hosts of two ranks it took less time than the
/// direct exchange over TCP between all members at every size measured, 4 B to 4 MiB
/// (bench/RESULTS.md, "the gloo backend's hierarchical allreduce").
inline constexpr std::size_t default_min_bytes = 0;

/// Which members of a group share a host.
struct host_layout {
  /// The group ranks on each host, ascending; hosts in the order of their lowest rank.
  std::vector<std::vector<int>> hosts;
  /// This member's host and its place among that host's members.
  int host = 0;
  int local_rank = 0;

  /// From every member's host key (index: group rank), as this member (`rank`) sees it:
  /// the same hosts, in the same order, on every member.
  static host_layout from_keys(std::span<const std::string> keys, int rank);

  int local_size() const { return static_cast<int>(hosts[static_cast<std::size_t>(host)].size()); }
  /// Slices of a tensor across hosts: the member count of the smallest host.
  int slices() const;
  /// Whether every host has the same number of members.
  bool balanced() const;
  /// Whether the hierarchical path applies: more than one host, and a host with two or
  /// more members.
  bool worthwhile() const;
  /// The group ranks with local rank `k` (< slices()), one per host, in host order.
  std::vector<int> slice_members(int k) const;
};

/// What one member asks of its group, published at connect with its address.
struct member_choice {
  /// Its host identity: TROUPE_GLOO_HOST_KEY when set, else the real host key.
  std::string key;
  /// Whether it allows the path (TROUPE_GLOO_HIERARCHICAL=0 says no; one no turns it off).
  bool enabled = true;
  /// Its threshold (TROUPE_GLOO_HIERARCHICAL_MIN); rank 0's holds for the group.
  std::uint64_t min_bytes = default_min_bytes;
};

/// This member's choice from the environment; `host_key` is core's host_key(). A bad
/// threshold is reported and the default used.
member_choice choice_from_env(std::string host_key);

struct open_options {
  int rank = 0;
  /// World rank of each group member, for errors.
  std::vector<int> world_ranks;
  /// The group as errors name it.
  std::string group;
  /// Allreduces of fewer bytes are not for this path (see wants()).
  std::size_t min_bytes = default_min_bytes;
  duration timeout = std::chrono::seconds(30);
  /// This member's gloo address, which its link across hosts binds (see path::open).
  std::string address;
};

class path {
 public:
  /// Collective over every member of the group, through `s` (namespaced for this group):
  /// the members of each host with two or more open a segment among themselves
  /// (gloo_shm::segment::open under the prefix "host<h>", with TROUPE_GLOO_SHM and
  /// TROUPE_GLOO_SHM_SLOT applied), then all members agree. Every member gets the same
  /// answer: a path when every such host has its segment, nullptr when one has not (the
  /// group then keeps to TCP). Then each slice's members connect a link between every two
  /// of them (gloo_link::link::open under "link<k>/<i>-<j>", host i's member listening on
  /// `address` for host j's, i < j). An error when the store fails, a member does not
  /// answer or a link does not connect within the timeout.
  static expected<std::unique_ptr<path>> open(const std::shared_ptr<store>& s, host_layout layout,
                                              const open_options& o);

  /// Whether an allreduce of `bytes` bytes takes this path (the same answer on every member).
  bool wants(std::size_t bytes) const noexcept { return bytes >= min_bytes_; }

  /// Allreduce of `t` in place over the group, in the three steps above (every member
  /// calls it in the same order); avg's sum is divided by the group's size. Fails
  /// (timeout, connection_lost, aborted, invalid_argument) naming the step and its members.
  expected<void> allreduce(tensor_view t, reduce_op op, const cpu_reduce_fn& fn,
                           clock::time_point deadline);

  /// Tells the other members of this host that this one failed. Idempotent.
  void mark_failed() noexcept;
  /// Makes the current and later waits on shared memory fail with errc::aborted. Safe
  /// from any thread.
  void abort() noexcept;

  const host_layout& layout() const noexcept { return layout_; }

 private:
  path() = default;

  // Runs `step` of the operation; an error (Gloo's and the segment's exceptions turned
  // into one by gloo_errors::guard) names the step and `who` (world ranks).
  template <class F>
  expected<void> run_step(const char* step, const std::vector<int>& who, F&& f);
  std::vector<int> world_of(std::span<const int> group_ranks) const;
  // Step 2 over links_: slice `part` of every host folded in host order, divided by
  // `divisor` (> 1 for avg).
  expected<void> across_by_links(tensor_view part, const cpu_reduce_fn& fn, std::size_t divisor,
                                 clock::time_point deadline);

  host_layout layout_;
  std::vector<int> world_ranks_;
  std::string group_;
  std::size_t min_bytes_ = 0;
  std::unique_ptr<gloo_shm::segment> local_;  // null: this member is alone on its host
  std::uint64_t local_seq_ = 0;               // operations run on local_ so far
  gloo_direct::scratch received_;             // what the peers' slices are received into
  // To this slice's member on each other host (index: host; none for this one's). Empty
  // when this member has no slice (a host with more members than the smallest).
  std::vector<std::unique_ptr<gloo_link::link>> links_;
  std::uint64_t link_seq_ = 0;  // exchanges over links_ so far
};

}  // namespace troupe::collectives::gloo_hier
