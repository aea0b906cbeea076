// process_group: a fixed set of ranks that run collectives together, through one backend.
//
// Contract for every backend:
// - Every member calls the same collectives in the same order; each call returns at once
//   with a work handle, and the operations of one group run one after another.
// - Every operation is bounded by its options' timeout. A peer that dies or does not
//   arrive fails the work within that timeout with an error naming the group and, where
//   known, the ranks that did not arrive. Nothing hangs.
// - Errors are sticky: after the first failure the group is broken and every pending and
//   later operation fails promptly with that error. Build a new group to go on. abort()
//   breaks a group on purpose, with the caller's error.
// - Arguments are checked before anything is sent: a bad size, root, rank or an
//   unsupported dtype/op pair fails the work with invalid_argument or unsupported.
// - The caller keeps the tensors' memory alive until the work completes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/collectives/comm_plan.hpp>
#include <troupe/collectives/options.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/collectives/work.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives {

/// Who a group is: what a backend needs to build one.
struct group_spec {
  /// Unique among the groups sharing `root_store`, e.g. "world" or "world/g1/c0".
  std::string name;
  /// This process's rank in the group.
  int rank = 0;
  /// The group's size.
  int size = 1;
  /// The world rank of each group rank (size() entries), for error messages.
  std::vector<int> global_ranks;
  /// The store every member shares; backends namespace their keys under `name`.
  std::shared_ptr<store> root_store;
  /// Bounds the backend's setup (connecting, id exchange, the check allreduce).
  duration timeout = default_timeout();
  /// Polled during the setup (may be empty): when it returns an error, the setup ends with
  /// that error soon after (gloo: within 20 ms, even inside a pair's connect), instead of
  /// waiting for a member that will not come until `timeout`.
  std::function<std::optional<troupe::error>()> interrupt{};
};

/// A fixed set of ranks running collectives through one backend; the contract is at the
/// top of this file. Built by the backend registry (make_group) or by troupe::init.
class process_group {
 public:
  virtual ~process_group() = default;
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  /// This process's rank in the group.
  int rank() const noexcept { return spec_.rank; }
  /// The number of ranks.
  int size() const noexcept { return spec_.size; }
  /// The group's name, unique among the groups sharing its store.
  const std::string& name() const noexcept { return spec_.name; }
  /// What the group was built from.
  const group_spec& spec() const noexcept { return spec_; }
  /// The registry name of the backend, e.g. "gloo".
  virtual std::string_view backend_name() const noexcept = 0;
  /// Whether this backend supports `op` on `type` (an allreduce of that pair would run).
  virtual bool supports(dtype type, reduce_op op) const noexcept = 0;

  /// Reduces `t` across the group in place; every rank gets the result.
  virtual work allreduce(tensor_view t, const allreduce_options& o = {}) = 0;
  /// Copies the root's `t` into every other rank's `t`.
  virtual work broadcast(tensor_view t, const broadcast_options& o = {}) = 0;
  /// Reduces `t` into the root's `t`; the other ranks' `t` is left unchanged.
  virtual work reduce(tensor_view t, const reduce_options& o = {}) = 0;
  /// `out` (size() * in.numel elements) receives every rank's `in`, in rank order.
  virtual work allgather(tensor_view in, tensor_view out, const allgather_options& o = {}) = 0;
  /// Like allgather, but only the root's `out` is written (others may pass an empty view).
  virtual work gather(tensor_view in, tensor_view out, const gather_options& o = {}) = 0;
  /// The root's `in` (size() * out.numel elements) is split in rank order into each `out`.
  virtual work scatter(tensor_view in, tensor_view out, const scatter_options& o = {}) = 0;
  /// Reduces `in` (size() * out.numel elements) and leaves block rank() in `out`.
  virtual work reduce_scatter(tensor_view in, tensor_view out,
                              const reduce_scatter_options& o = {}) = 0;
  /// Block i of `in` goes to rank i; block j of `out` comes from rank j. Equal blocks by
  /// default, or the uneven counts of `o`.
  virtual work all_to_all(tensor_view in, tensor_view out, const all_to_all_options& o = {}) = 0;
  /// Completes once every rank has entered it.
  virtual work barrier(const barrier_options& o = {}) = 0;
  /// Sends `t` to group rank `dst`; matched with a recv of the same tag there.
  virtual work send(tensor_view t, int dst, const p2p_options& o = {}) = 0;
  /// Receives into `t` from group rank `src`.
  virtual work recv(tensor_view t, int src, const p2p_options& o = {}) = 0;

  /// The sticky error, if the group has failed.
  virtual std::optional<troupe::error> failure() const = 0;
  /// Fails the group with `why`, at once: `why` becomes the sticky error (a group that had
  /// already failed keeps its first error), queued and running operations fail with it
  /// without waiting for their timeouts (the transport is closed under a running one), and
  /// every later operation fails with it. The other members are not told; they fail when
  /// they next exchange data with this one, or abort too. Safe from any thread; idempotent.
  /// shutdown() still releases the threads. Used to retire a group whose membership is
  /// over (collectives/elastic_group.hpp).
  virtual void abort(troupe::error why) = 0;
  /// Stops the group: queued work fails with errc::shut_down, the running operation is
  /// given up to `timeout`. Idempotent; the destructor does the same.
  virtual void shutdown(duration timeout) = 0;

  /// A backend-native way to build a child group (e.g. ncclCommSplit), called on every
  /// member of this group with the same arguments order. `child` is null on ranks that
  /// are not in any child. Returns null when the backend has none (the caller then
  /// builds the child through the registry).
  virtual expected<std::shared_ptr<process_group>> split_native(const group_spec* child,
                                                                int color) {
    (void)child;
    (void)color;
    return std::shared_ptr<process_group>();
  }

  /// Retires the group because its membership is over: for its operations the same as
  /// abort(why) (queued and running ones fail with `why` at once, later ones too), but a
  /// backend that can carry its communicator into the next epoch's group (nccl, through
  /// ncclCommShrink) keeps it for rebuild_native() instead of destroying it. shutdown()
  /// releases whatever is kept. The default is abort(why).
  virtual void retire(troupe::error why) { abort(std::move(why)); }

  /// For a backend that can rebuild in place (nccl): the state of the communicator a
  /// successor would start from (comm_plan.hpp). nullopt for the others, whose successor
  /// is always built anew through the registry.
  virtual std::optional<comm_state> rebuild_state() const { return std::nullopt; }

  /// Builds the group `next` from this retired group's communicator as `plan` says (keep
  /// or shrink; for keep, nccl splits it with one color so that the new group has one of
  /// its own), collectively with the other members of `next`, which must all have agreed
  /// on the same plan. The excluded ranks do not call it. Returns null when the backend
  /// has no native rebuild (the default); then the caller builds `next` anew.
  virtual expected<std::shared_ptr<process_group>> rebuild_native(const group_spec& next,
                                                                  const comm_plan& plan) {
    (void)next;
    (void)plan;
    return std::shared_ptr<process_group>();
  }

  /// A fresh number for naming a child group; the same on every member when they create
  /// children in the same order.
  int next_child_id() noexcept { return ++children_; }

 protected:
  /// For backends: the group that `spec` describes.
  explicit process_group(group_spec spec) : spec_(std::move(spec)) {}

 private:
  group_spec spec_;
  std::atomic<int> children_{0};
};

/// "group 'world' (gloo, rank 1 of 4)", for messages.
std::string describe(const process_group& g);
/// Ranks as "[1, 3]".
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace troupe::collectives
