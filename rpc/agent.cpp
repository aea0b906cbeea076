#include "rpc/agent.hpp"

namespace troupe::rpc {

agent::~agent() {
  if (core_) (void)core_->shutdown(core_->options().shutdown_timeout);
}

expected<void> agent::leave() { return core_->leave(core_->options().shutdown_timeout); }

expected<void> agent::shutdown(duration timeout) {
  return core_->shutdown(timeout > duration::zero() ? timeout : core_->options().shutdown_timeout);
}

namespace detail {

rref_holder::rref_holder(std::shared_ptr<agent_core> core, worker_info owner, std::uint64_t id,
                         future<wire::frame> created, bool counted, std::uint64_t fork)
    : core_(core),
      owner_(std::move(owner)),
      id_(id),
      created_(std::move(created)),
      counted_(counted),
      fork_(fork) {}

rref_holder::~rref_holder() {
  if (!counted_) return;
  if (auto c = core_.lock()) c->release_rref(owner_, id_, fork_);
}

std::shared_ptr<rref_context> rref_holder::context() const {
  auto c = core_.lock();
  return std::shared_ptr<rref_context>(c, c.get());
}

expected<void> rref_holder::wait_created(duration timeout) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!creation_) {
    auto r = created_.get(timeout);
    if (!r && r.error().code() == errc::timeout && created_.valid()) return std::move(r).error();
    creation_ = r ? ok() : expected<void>(std::move(r).error());
  }
  return *creation_;
}

future<wire::frame> rref_holder::fetch(duration timeout) {
  auto c = core_.lock();
  if (!c) return make_error_future<wire::frame>(make_error(errc::shut_down, "the agent is gone"));
  return c->fetch_rref(owner_, id_, timeout);
}

}  // namespace detail
}  // namespace troupe::rpc
