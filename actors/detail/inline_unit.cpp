#include <troupe/actors/detail/inline_unit.hpp>

#include <caf/resumable.hpp>
#include <caf/scheduler/abstract_coordinator.hpp>
#include <memory>
#include <utility>

#include <troupe/rpc/function_table.hpp>

namespace troupe::actors::detail {

void inline_unit::exec_later(caf::resumable* job) {
  if (accepting_ && woken_ == nullptr) {
    woken_ = job;  // the target of deliver(): run below, on this thread
    return;
  }
  system().scheduler().enqueue(job);
}

caf::resumable* inline_unit::enqueue_here(caf::abstract_actor& target,
                                          caf::mailbox_element_ptr what) {
  if (depth_ > 0) {  // a delivery from inside a handler running here: no nesting
    target.enqueue(std::move(what), nullptr);
    return nullptr;
  }
  accepting_ = true;
  target.enqueue(std::move(what), this);
  accepting_ = false;
  return std::exchange(woken_, nullptr);
}

void inline_unit::deliver(caf::abstract_actor& target, caf::mailbox_element_ptr what) {
  caf::resumable* job = enqueue_here(target, std::move(what));
  if (job == nullptr) return;  // the target was already scheduled or running elsewhere
  run(job, max_throughput);
}

void inline_unit::deliver_batched(caf::abstract_actor& target, caf::mailbox_element_ptr what) {
  caf::resumable* job = enqueue_here(target, std::move(what));
  if (job == nullptr) return;  // already woken (maybe waiting in batch_), or running elsewhere
  if (batch_.empty() && !rpc::at_end_of_read_batch([this] { run_batch(); })) {
    run(job, max_throughput);  // not inside a read batch: run now
    return;
  }
  batch_.push_back(job);
}

void inline_unit::run_batch() {
  auto jobs = std::move(batch_);
  batch_.clear();
  for (auto* job : jobs) run(job, batch_throughput);
}

void inline_unit::run(caf::resumable* job, std::size_t throughput) {
  ++depth_;
  auto result = job->resume(this, throughput);
  --depth_;
  switch (result) {
    case caf::resumable::resume_later:
      system().scheduler().enqueue(job);  // keeps the reference, as CAF's workers do
      break;
    case caf::resumable::done:
    case caf::resumable::awaiting_message:
    case caf::resumable::shutdown_execution_unit:
      intrusive_ptr_release(job);
      break;
  }
}

inline_unit& inline_unit::of(caf::actor_system& sys) {
  thread_local caf::actor_system* owner = nullptr;
  thread_local std::unique_ptr<inline_unit> unit;
  if (owner != &sys || !unit) {
    if (unit) unit->run_batch();  // another system's batch: run it before replacing its unit
    unit = std::make_unique<inline_unit>(sys);
    owner = &sys;
  }
  return *unit;
}

}  // namespace troupe::actors::detail
