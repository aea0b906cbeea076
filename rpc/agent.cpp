#include <troupe/rpc/agent.hpp>

#include <troupe/rpc/detail/agent_core.hpp>

namespace troupe::rpc {

agent::~agent() {
  if (core_) (void)core_->shutdown(core_->options().shutdown_timeout);
}

worker_info agent::self() const { return core_->self(); }

std::vector<worker_info> agent::workers() const { return core_->workers(); }

expected<worker_info> agent::worker(std::string_view name) const {
  return core_->find(worker_ref(name));
}

expected<worker_info> agent::worker_by_id(std::int32_t id) const {
  return core_->find(worker_ref::by_id(id));
}

bool agent::is_dynamic() const noexcept { return core_->dynamic(); }

function_table& agent::functions() { return core_->functions(); }

device_setup agent::device_setup_now() const { return core_->setup(); }

const rpc_backend_options& agent::options() const noexcept { return core_->options(); }

bool agent::expel(std::string_view name, std::string_view tag, const error& why) {
  return core_->expel(std::string(name), tag, why);
}

std::uint64_t agent::add_membership_listener(membership_listener l) {
  return core_->add_membership_listener(std::move(l));
}

void agent::remove_membership_listener(std::uint64_t id) { core_->remove_membership_listener(id); }

std::size_t agent::owned_remote_refs() const { return core_->owned_rrefs(); }

duration agent::timeout_of(const call_options& o) const { return core_->timeout_of(o); }

void agent::spin_for_reply(const future<wire::frame>& reply) const {
  // This process's I/O thread completes the reply: the spin yields the core to it.
  if (const auto grant = core_->reply_spin().grant(); grant.count() > 0)
    detail::spin_policy::spin_until(grant, [&] { return reply.is_ready(); });
}

void agent::note_reply_wait(clock::time_point started) const {
  core_->reply_spin().record(clock::now() - started);
}

std::weak_ptr<detail::rref_context> agent::decode_context() const {
  return std::shared_ptr<detail::rref_context>(core_, context());
}

detail::rref_context* agent::context() const noexcept { return core_.get(); }

future<wire::frame> agent::send_call(const call_options& o, const worker_ref& to,
                                     std::string_view fn, call_kind kind, std::uint64_t rref_id,
                                     detail::write_args_fn write, const void* args) {
  auto who = core_->find(to);
  if (!who)
    return make_error_future<wire::frame>(
        std::move(who).error().with_operation(strcat("rpc '", fn, "'")));
  const std::uint8_t flags = kind == call_kind::one_way     ? detail::request_no_reply
                             : kind == call_kind::as_remote ? detail::request_as_remote
                                                            : std::uint8_t{0};
  auto timeout = core_->timeout_of(o);
  auto fb = core_->begin_request(fn, flags, rref_id, timeout);
  if (o.request_id) *o.request_id = fb.id();
  // Remote references among the arguments become shares of the callee; their owners are
  // told (commit) before the request leaves, while this process still holds its own.
  detail::message_refs refs(*core_, who->name);
  binary_serializer f(fb.message(), &fb.tensors(), &refs);
  if (auto e = write(f, args))
    return make_error_future<wire::frame>(make_error(errc::invalid_argument,
                                                     "cannot serialize the arguments of '", fn,
                                                     "': ", e.err().message()));
  refs.commit();
  const bool one_way = kind == call_kind::one_way;
  return core_->send_request(
      *who, std::move(fb), timeout, !one_way,
      one_way && o.combine_writes ? detail::write_mode::combine : detail::write_mode::now, fn);
}

std::shared_ptr<detail::rref_holder> agent::start_remote(const call_options& o,
                                                         const worker_ref& to, std::string_view fn,
                                                         detail::write_args_fn write,
                                                         const void* args) {
  auto who = core_->find(to);
  auto id = core_->next_rref_id();
  auto created = send_call(o, to, fn, call_kind::as_remote, id, write, args);
  if (!who)
    return std::make_shared<detail::rref_holder>(core_, worker_info{}, id, std::move(created),
                                                 false);
  return std::make_shared<detail::rref_holder>(core_, *who, id, std::move(created), true);
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
