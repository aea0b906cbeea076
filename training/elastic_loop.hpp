// elastic_loop: data-parallel training that goes on in the same processes when ranks die or
// join (docs/training.md, "Training that survives"). It runs numbered global steps on the
// group of the newest epoch (collectives::elastic_group):
//
//   auto loop = elastic_loop::make(group, model.parameters(), {momentum_view}, o).value();
//   loop->run([&](const elastic_step& s) {       // this rank's part of global step s.step
//              auto [b, e] = split_evenly(batch, s.rank, s.world);
//              model.zero_grad(); model.train_batch(data, first + b, first + e);
//              return ok(); },
//            [&](const elastic_step&) { sgd_with_momentum(); return ok(); });
//
// Contract:
// - compute(step) leaves this rank's gradient in every parameter's grad buffer; the loop
//   averages them over the group (a sum divided by the group's size, the size of the
//   current epoch), then apply(step) updates the parameters and the optimizer state.
// - When the epoch changes during a step, every member discards that step: a member that
//   already applied it rolls back to the copy of the state it kept before the step, so all
//   members redo the step in the new epoch from the same state.
// - After every (re)build, the members agree on the step to run (the smallest among the
//   members that have state) and the lowest rank with state broadcasts the parameters and
//   the optimizer state to all, so a newcomer starts from the survivors' state. Then
//   on_resize runs, and steps go on; compute() sees the new rank and world size, so the
//   data is split by the new world size from the next step on.
// - run() returns once every member has finished `steps` steps and confirmed it together.
//   Errors other than membership_changed (a user callback's, a timeout) end it with that
//   error, naming the step and epoch. Every collective is bounded by `timeout`.
// - Memory: one copy of the parameters and of the optimizer state (the rollback copy).
// - Threading: one thread calls run(); the callbacks run on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/training/parameter.hpp>

namespace troupe::training {

/// One global step as this member runs it.
struct elastic_step {
  /// The global step number, 0-based, the same on every member.
  std::int64_t step = 0;
  /// This member's rank and the group's size in the current epoch.
  int rank = 0;
  int world = 1;
  /// The current epoch.
  std::uint64_t epoch = 0;
};

struct elastic_loop_options {
  /// Global steps to run in all; >= 1.
  std::int64_t steps = 1;
  /// Bound of every collective the loop makes.
  duration timeout = std::chrono::seconds(60);
  /// Bound of each rebuild of the group for a new epoch.
  duration rebuild_timeout = std::chrono::seconds(30);
  /// Called after each (re)build and state exchange, before the next step (may be empty).
  std::function<void(const elastic_step& next, const membership::epoch& epoch)> on_resize;
};

class elastic_loop {
 public:
  using step_fn = std::function<expected<void>(const elastic_step&)>;

  /// A loop over `group` (which must outlive it) training `params` (values and grads:
  /// floating dtypes, CPU) whose optimizer keeps `optimizer_state` (CPU tensors, any dtype;
  /// may be empty). Refuses bad parameters or options naming what is wrong.
  static expected<std::unique_ptr<elastic_loop>> make(collectives::elastic_group& group,
                                                      std::vector<parameter> params,
                                                      std::vector<tensor_view> optimizer_state,
                                                      elastic_loop_options options);

  /// Runs steps until `steps` are done on every member (see the contract above).
  expected<void> run(const step_fn& compute, const step_fn& apply);

  /// Steps applied by this member and kept (its step count).
  std::int64_t steps_done() const noexcept { return step_; }
  /// Step attempts this member gave up or rolled back because the epoch changed.
  std::int64_t discarded() const noexcept { return discarded_; }
  /// Groups this member has trained on (1 + the rebuilds).
  std::int64_t groups() const noexcept { return groups_; }

 private:
  elastic_loop() = default;
  // Builds the group of the newest epoch and makes every member's state the same.
  expected<void> resync();
  // The rest of resync() on a built group; membership_changed sends resync() round again.
  expected<void> agree_and_broadcast(collectives::process_group& g, std::uint64_t epoch);
  void keep_copy();
  void restore_copy();

  collectives::elastic_group* group_ = nullptr;
  std::vector<parameter> params_;
  std::vector<tensor_view> state_;            // the parameters' values, then the optimizer's
  std::vector<std::vector<std::byte>> copy_;  // state_ before the last applied step
  elastic_loop_options options_;
  std::shared_ptr<collectives::process_group> current_;
  elastic_step at_;
  bool has_state_ = false;  // false for a newcomer until it received the state
  std::int64_t step_ = 0;
  std::int64_t discarded_ = 0;
  std::int64_t groups_ = 0;
};

/// [begin, end) of part `rank` when `items` are split into `world` contiguous parts whose
/// sizes differ by at most one (the first ones larger).
std::pair<std::int64_t, std::int64_t> split_evenly(std::int64_t items, int rank, int world);

}  // namespace troupe::training
