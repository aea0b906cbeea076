// inline_unit: runs the actor that a remote message wakes on the thread that delivered the
// message (an RPC I/O thread), instead of waking one of CAF's scheduler threads. A remote
// request then costs one thread switch less on the receiving side. Only the woken target
// runs here, for a bounded number of messages; every other actor it wakes, and the target
// itself if it still has work after that, go to CAF's scheduler as usual.
//
// Plain sends arrive many to a socket read: deliver_batched() enqueues each at once (in
// arrival order) but runs a target it woke only once the frames of that read are handled
// (rpc::at_end_of_read_batch), so a stream of sends costs one run per read and no
// scheduler wake-up per message.
//
// Handlers of published actors therefore must not block, which is CAF's rule for
// event-based actors anyway.
#pragma once

#include <caf/abstract_actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/execution_unit.hpp>
#include <caf/mailbox_element.hpp>
#include <vector>

namespace troupe::actors::detail {

class inline_unit final : public caf::execution_unit {
 public:
  explicit inline_unit(caf::actor_system& sys) : caf::execution_unit(&sys) {}

  void exec_later(caf::resumable* job) override;

  /// Enqueues `what` into `target` and, if that woke it, runs it here.
  void deliver(caf::abstract_actor& target, caf::mailbox_element_ptr what);

  /// Enqueues `what` into `target` and, if that woke it, runs it here at the end of the
  /// current read batch (or at once when there is no batch).
  void deliver_batched(caf::abstract_actor& target, caf::mailbox_element_ptr what);

  /// The unit of this thread for `sys`.
  static inline_unit& of(caf::actor_system& sys);

 private:
  // Resumes `job` here (it holds a reference); reschedules it when it has more to do.
  void run(caf::resumable* job, std::size_t throughput);
  void run_batch();
  // Enqueues `what` into `target` with this unit as the one to wake it on; returns the job
  // it woke, or null (already scheduled or running elsewhere, or a nested delivery, which
  // is enqueued for the scheduler).
  caf::resumable* enqueue_here(caf::abstract_actor& target, caf::mailbox_element_ptr what);

  static constexpr std::size_t max_throughput = 64;
  static constexpr std::size_t batch_throughput = 4096;
  caf::resumable* woken_ = nullptr;
  std::vector<caf::resumable*> batch_;  // woken by deliver_batched, run at the batch end
  bool accepting_ = false;
  int depth_ = 0;
};

}  // namespace troupe::actors::detail
