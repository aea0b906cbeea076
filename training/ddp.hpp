// ddp: data-parallel training of one model replica per rank. It does not own the model:
// it is given the parameters' value and gradient buffers as tensor views.
//
//   auto d = ddp::make(world, params, {}).value();   // broadcasts rank 0's weights
//   for (auto& batch : shard) {
//     forward(batch); backward(batch, [&](size_t i) { d->mark_ready(i).value(); });
//     d->finish_step().value();                     // gradients are now averaged
//     sgd_step(params); d->after_optimizer_step().value();
//   }
//
// Contract:
// - Every rank builds the ddp with the same parameter list (names, dtypes, sizes, order);
//   make() checks it across the ranks and refuses a mismatch naming the first difference.
// - Gradients are grouped into buckets (buckets.hpp). mark_ready(i) says parameter i's
//   gradient is final for this step; when all of a bucket's parameters are ready, the
//   bucket is handed to the comm hook (asynchronously), buckets strictly in order.
//   finish_step() waits for every bucket and leaves the average gradient over the ranks in
//   every grad buffer. A parameter not marked by finish_step() is an error unless
//   find_unused_parameters is set (then its gradient counts as zero).
// - Inside a no_sync() guard steps only accumulate: nothing is communicated, the
//   gradients are left as they are (add into them), and the next synchronized step
//   all-reduces the accumulated sum.
// - Periodic model averaging (post-local SGD): for the first warmup_steps synchronized
//   steps gradients are all-reduced as usual; after that they stay local and
//   after_optimizer_step() averages the parameters every `period` steps (counted from the
//   end of warm-up, starting with it).
// - ddp is a joinable (collectives/join.hpp): under an enabled join scope each step first
//   notifies the scope and exchanges three counters (ranks still training, whether they
//   all-reduce gradients, whether they average), so joined ranks can shadow exactly the
//   collectives of the step. Join arguments: divide_by_initial_world_size (bool, default
//   true: gradients are divided by the world size even when fewer ranks contribute) and
//   sync_final_model (bool, default true: at the end every rank takes the weights of the
//   highest rank among the last to join).
// - Every collective is bounded by options.timeout; errors are returned, never thrown.
// - Threading: one thread drives a ddp; the comm hooks' completions run on the group's
//   threads and touch only the bucket they belong to.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <troupe/collectives/join.hpp>
#include <troupe/training/buckets.hpp>
#include <troupe/training/comm_hooks.hpp>
#include <troupe/training/flat_views.hpp>
#include <troupe/training/object_codec.hpp>
#include <troupe/training/parameter.hpp>

namespace troupe::training {

struct averaging_options {
  /// Average the parameters every `period` synchronized steps after warm-up; >= 1.
  std::int64_t period = 1;
  /// Synchronized steps with ordinary gradient all-reduce before local SGD starts; >= 0.
  std::int64_t warmup_steps = 0;
};

struct ddp_options {
  /// Byte cap of each bucket, and of the first one (smaller, to start sending early).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  /// Copy rank 0's parameters to every rank in make().
  bool broadcast_parameters = true;
  /// Treat parameters not marked ready by finish_step() as having zero gradient.
  bool find_unused_parameters = false;
  /// How buckets are reduced; empty: allreduce_hook().
  comm_hook hook;
  /// Post-local SGD; unset: gradients are all-reduced every synchronized step.
  std::optional<averaging_options> averaging;
  /// Bound of every collective the strategy makes.
  duration timeout = default_timeout();
};

class ddp final : public collectives::joinable {
 public:
  /// Builds the strategy over `group` (collective: every rank calls it). Checks the
  /// parameters locally and across ranks, plans the buckets, broadcasts rank 0's weights.
  static expected<std::unique_ptr<ddp>> make(std::shared_ptr<collectives::process_group> group,
                                             std::vector<parameter> params,
                                             ddp_options options = {});
  /// Waits (bounded by the timeout) for buckets still being reduced.
  ~ddp() override;

  // -- one step -------------------------------------------------------------------
  /// Starts a step: notifies an enabled join scope and exchanges its counters. Optional:
  /// mark_ready() and finish_step() start the step when it has not been started.
  expected<void> begin_step();
  /// Parameter `index`'s gradient is final for this step; launches buckets that are full.
  expected<void> mark_ready(std::size_t index);
  /// Waits for the step's buckets; every grad buffer then holds the average gradient.
  expected<void> finish_step();
  /// begin_step(), every parameter marked in reverse registration order, finish_step().
  expected<void> sync_gradients();
  /// Call after each optimizer step: averages the parameters when this step is due.
  /// Returns whether it averaged.
  expected<bool> after_optimizer_step();

  /// While alive, steps do not communicate (gradient accumulation). Nestable.
  class no_sync_guard {
   public:
    explicit no_sync_guard(ddp& d) : d_(&d) { ++d_->no_sync_depth_; }
    no_sync_guard(no_sync_guard&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (d_) --d_->no_sync_depth_;
    }

   private:
    ddp* d_;
  };
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  // -- strategy collectives ---------------------------------------------------------
  /// Returns once every rank has entered it.
  expected<void> barrier();
  /// Rank `src`'s bytes on every rank.
  expected<bytes> broadcast_bytes(const bytes& data, int src = 0);
  /// Rank `src`'s object on every rank, through object_codec<T>.
  template <class T>
  expected<T> broadcast_object(const T& obj, int src = 0);
  /// Reduces `t` in place on every rank: reduce_op::sum or reduce_op::avg (the mean).
  expected<void> reduce(tensor_view t, collectives::reduce_op op = collectives::reduce_op::avg);

  // -- introspection ------------------------------------------------------------------
  const std::vector<bucket_plan>& bucket_plans() const noexcept { return plans_; }
  /// Synchronized steps finished (no_sync steps do not count).
  std::int64_t steps() const noexcept { return steps_; }
  /// Parameter averagings done by after_optimizer_step().
  std::int64_t averagings() const noexcept { return averagings_; }
  int rank() const noexcept { return group_->rank(); }
  int world_size() const noexcept { return group_->size(); }
  const std::vector<parameter>& parameters() const noexcept { return params_; }

  // -- joinable ------------------------------------------------------------------------
  expected<std::unique_ptr<collectives::join_hook>> join_hook(
      const collectives::join_args& args) override;
  device join_device() const override { return device_; }
  collectives::process_group& join_process_group() const override { return *group_; }

 private:
  class joined_hook;
  struct bucket_state {
    flat_views flat;
    std::size_t pending = 0;
    future<void> result;
    std::int64_t launched_ns = 0;  // for the trace: when the hook got the bucket (0: off)
  };
  struct step_flags {
    std::int32_t active = 0, grad_sync = 0, average = 0;
  };

  ddp() = default;
  expected<void> check_across_ranks();
  expected<void> broadcast_values(int root);
  expected<void> average_values(double divisor);
  expected<step_flags> exchange_flags(step_flags mine);
  void launch(std::size_t b);
  expected<void> wait_buckets();
  bool averaging_due() const;

  std::shared_ptr<collectives::process_group> group_;
  std::vector<parameter> params_;
  ddp_options options_;
  // Waits on this strategy's own work allow this much beyond options_.timeout, so that
  // the work's timeout, which names the group and ranks, fires first.
  static constexpr duration wait_grace = std::chrono::seconds(1);
  device device_;
  std::vector<bucket_plan> plans_;
  std::vector<bucket_state> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<flat_views> values_;  // parameter values by dtype/device

  // Per step.
  bool in_step_ = false;
  std::int64_t step_started_ns_ = 0;  // for the trace (0: tracing off)
  bool step_counts_ = false;          // not under no_sync: counts as a synchronized step
  bool step_syncs_ = false;           // gradients are reduced in this step
  bool step_averages_ = false;
  double grad_divisor_ = 1;
  double avg_divisor_ = 1;
  std::vector<char> ready_;
  std::size_t next_launch_ = 0;

  bool average_pending_ = false;
  bool divide_by_initial_world_size_ = true;
  int no_sync_depth_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t averagings_ = 0;
};

template <class T>
expected<T> ddp::broadcast_object(const T& obj, int src) {
  bytes mine;
  mine.reserve(256);
  if (rank() == src) {
    byte_writer w(mine);
    object_codec<T>::encode(w, obj);
  }
  auto got = broadcast_bytes(mine, src);
  if (!got) return std::move(got).error();
  byte_reader r(*got);
  auto v = object_codec<T>::decode(r);
  if (!v) return std::move(v).error().with_operation("ddp.broadcast_object");
  if (!r.at_end())
    return make_error(errc::protocol_error, "ddp.broadcast_object: ", r.remaining(),
                      " bytes left over after decoding; the codecs of the ranks differ");
  return v;
}

}  // namespace troupe::training
