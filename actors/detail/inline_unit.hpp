// inline_unit: runs the actor that a remote message wakes on the thread that delivered the
// message (an RPC I/O thread), instead of waking one of CAF's scheduler threads. A remote
// request then costs one thread switch less on the receiving side. Only the woken target
// runs here, for a bounded number of messages; every other actor it wakes, and the target
// itself if it still has work after that, go to CAF's scheduler as usual.
//
// Handlers of published actors therefore must not block, which is CAF's rule for
// event-based actors anyway.
#pragma once

#include <caf/abstract_actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/execution_unit.hpp>
#include <caf/mailbox_element.hpp>

namespace troupe::actors::detail {

class inline_unit final : public caf::execution_unit {
 public:
  explicit inline_unit(caf::actor_system& sys) : caf::execution_unit(&sys) {}

  void exec_later(caf::resumable* job) override;

  /// Enqueues `what` into `target` and, if that woke it, runs it here.
  void deliver(caf::abstract_actor& target, caf::mailbox_element_ptr what);

  /// The unit of this thread for `sys`.
  static inline_unit& of(caf::actor_system& sys);

 private:
  static constexpr std::size_t max_throughput = 64;
  caf::resumable* woken_ = nullptr;
  bool accepting_ = false;
  int depth_ = 0;
};

}  // namespace troupe::actors::detail
