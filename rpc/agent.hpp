// agent: a named worker in an RPC group. Calls functions on other workers by name with
// typed arguments and results, moves tensors with device maps applied, and holds remote
// references. Create one with init_rpc() (rpc/backend_registry.hpp).
//
// Contract:
// - Every call has a deadline (call_options::timeout, else options.rpc_timeout); nothing
//   waits forever. A call to an unknown worker fails at once with errc::not_found.
// - A callee's error reaches the caller with the callee's name in error::worker().
// - A peer that dies fails every pending call to it with errc::connection_lost (or
//   errc::peer_left after an orderly shutdown), naming it.
// - shutdown() is graceful (static: outstanding calls done, then a barrier; dynamic:
//   leave()), bounded, idempotent; the destructor calls it. Never call it from inside an
//   RPC function or a continuation.
// - Futures returned here complete on an I/O thread (or a worker thread); continuations
//   attached to them must be short and must not block.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/future.hpp"
#include "core/worker_info.hpp"
#include "devicemap/derive.hpp"
#include "rpc/detail/agent_core.hpp"
#include "rpc/function_table.hpp"
#include "rpc/membership_event.hpp"
#include "rpc/options.hpp"
#include "rpc/remote_ref.hpp"
#include "rpc/serializer.hpp"
#include "rpc/worker_ref.hpp"

namespace troupe::rpc {

/// A named worker in an RPC group; the contract is at the top of this file. Made by
/// init_rpc() or init_rpc_from_env(), or by troupe::init with init_options::rpc.
class agent {
 public:
  /// For backends: a handle over a running core. Users call init_rpc() instead.
  explicit agent(std::shared_ptr<detail::agent_core> core) : core_(std::move(core)) {}
  /// shutdown() with the options' shutdown timeout.
  ~agent();
  agent(const agent&) = delete;
  agent& operator=(const agent&) = delete;

  /// This worker.
  worker_info self() const { return core_->self(); }
  /// The current members, ordered by id.
  std::vector<worker_info> workers() const { return core_->workers(); }
  /// A member by name, or errc::not_found listing the members.
  expected<worker_info> worker(std::string_view name) const {
    return core_->find(worker_ref(name));
  }
  /// A member by id.
  expected<worker_info> worker_by_id(std::int32_t id) const {
    return core_->find(worker_ref::by_id(id));
  }
  /// True when the group was formed without a world size (workers join and leave).
  bool is_dynamic() const noexcept { return core_->dynamic(); }
  /// The functions this worker serves.
  function_table& functions() { return core_->functions(); }
  /// This worker's reverse device maps and device list (they change as workers join).
  device_setup device_setup_now() const { return core_->setup(); }
  /// The options the agent was made with.
  const rpc_backend_options& options() const noexcept { return core_->options(); }

  ///@{
  /// Calls `fn` on `to` with `args`; the future holds its result of type R. Without
  /// call options: the default timeout, no device map override.
  template <class R, class... Args>
  future<R> rpc_async(const call_options& o, const worker_ref& to, std::string_view fn,
                      const Args&... args);
  template <class R, class... Args>
  future<R> rpc_async(const worker_ref& to, std::string_view fn, const Args&... args) {
    return rpc_async<R>(call_options{}, to, fn, args...);
  }
  ///@}
  ///@{
  /// rpc_async, then waits for the result (bounded by the call's timeout).
  template <class R, class... Args>
  expected<R> rpc_sync(const call_options& o, const worker_ref& to, std::string_view fn,
                       const Args&... args);
  template <class R, class... Args>
  expected<R> rpc_sync(const worker_ref& to, std::string_view fn, const Args&... args) {
    return rpc_sync<R>(call_options{}, to, fn, args...);
  }
  ///@}
  ///@{
  /// A one-way call: runs `fn` on `to` and sends nothing back (no response frame; the
  /// function's result is dropped and its errors are logged on `to`). Calls to one worker
  /// from one thread arrive in order. The future completes once the request is handed to
  /// the connection, or fails when it cannot be sent (unknown worker, arguments not
  /// serializable, connection lost).
  template <class... Args>
  future<void> notify(const call_options& o, const worker_ref& to, std::string_view fn,
                      const Args&... args);
  template <class... Args>
  future<void> notify(const worker_ref& to, std::string_view fn, const Args&... args) {
    return notify(call_options{}, to, fn, args...);
  }
  ///@}
  ///@{
  /// Runs `fn` on `to` and keeps its result there; returns a reference to it at once.
  template <class T, class... Args>
  remote_ref<T> remote(const call_options& o, const worker_ref& to, std::string_view fn,
                       const Args&... args);
  template <class T, class... Args>
  remote_ref<T> remote(const worker_ref& to, std::string_view fn, const Args&... args) {
    return remote<T>(call_options{}, to, fn, args...);
  }
  ///@}

  /// Dynamic groups: removes this worker from every member and the store, then stops.
  expected<void> leave();
  /// See the contract above. `timeout` zero: options.shutdown_timeout.
  expected<void> shutdown(duration timeout = duration::zero());

  /// Under an outside membership (rpc_backend_options::membership_tag): takes the worker
  /// `name` out of this worker's view of the group, if its record carries `tag` (empty:
  /// whatever it carries). Calls waiting on it fail with `why` (the membership's
  /// membership_changed error naming the epoch), its remote-reference shares are dropped,
  /// and listeners hear `failed` with `why`. Returns whether it was taken out (false: not a
  /// member, another tag, this worker itself, or a static group). Does not block.
  bool expel(std::string_view name, std::string_view tag, const error& why) {
    return core_->expel(std::string(name), tag, why);
  }

  /// Calls `l` after every membership change this worker sees (rpc/membership_event.hpp);
  /// returns an id for remove_membership_listener.
  std::uint64_t add_membership_listener(membership_listener l) {
    return core_->add_membership_listener(std::move(l));
  }
  /// Stops calling the listener `id` (an unknown id is ignored).
  void remove_membership_listener(std::uint64_t id) { core_->remove_membership_listener(id); }

  /// Remote references this worker owns right now (diagnostics, tests).
  std::size_t owned_remote_refs() const { return core_->owned_rrefs(); }

 private:
  template <class... Args>
  future<wire::frame> start_call(const call_options& o, const worker_ref& to, std::string_view fn,
                                 std::uint8_t flags, std::uint64_t rref_id, const Args&... args);
  std::shared_ptr<detail::agent_core> core_;
};

template <class... Args>
future<void> agent::notify(const call_options& o, const worker_ref& to, std::string_view fn,
                           const Args&... args) {
  return start_call(o, to, fn, detail::request_no_reply, 0, args...).then([](wire::frame&&) {});
}

template <class... Args>
future<wire::frame> agent::start_call(const call_options& o, const worker_ref& to,
                                      std::string_view fn, std::uint8_t flags,
                                      std::uint64_t rref_id, const Args&... args) {
  auto who = core_->find(to);
  if (!who)
    return make_error_future<wire::frame>(
        std::move(who).error().with_operation(strcat("rpc '", fn, "'")));
  auto timeout = core_->timeout_of(o);
  auto fb = core_->begin_request(fn, flags, rref_id, timeout);
  if (o.request_id) *o.request_id = fb.id();
  // Remote references among the arguments become shares of the callee; their owners are
  // told (commit) before the request leaves, while this process still holds its own.
  detail::message_refs refs(*core_, who->name);
  binary_serializer f(fb.message(), &fb.tensors(), &refs);
  if (auto e = f(args...))
    return make_error_future<wire::frame>(make_error(errc::invalid_argument,
                                                     "cannot serialize the arguments of '", fn,
                                                     "': ", e.err().message()));
  refs.commit();
  const bool one_way = (flags & detail::request_no_reply) != 0;
  return core_->send_request(
      *who, std::move(fb), timeout, !one_way,
      one_way && o.combine_writes ? detail::write_mode::combine : detail::write_mode::now, fn);
}

namespace detail {
template <class R>
expected<R> decode_result(wire::frame&& f, inspect_context* ctx) {
  if constexpr (std::is_void_v<R>) {
    return ok();
  } else {
    R r{};
    TROUPE_TRY(deserialize_with(ctx, f.message, &f.tensors, r));
    return r;
  }
}
}  // namespace detail

template <class R, class... Args>
future<R> agent::rpc_async(const call_options& o, const worker_ref& to, std::string_view fn,
                           const Args&... args) {
  std::weak_ptr<detail::agent_core> weak = core_;
  return start_call(o, to, fn, 0, 0, args...).then([weak](wire::frame&& f) {
    auto core = weak.lock();
    return detail::decode_result<R>(std::move(f), core.get());
  });
}

template <class R, class... Args>
expected<R> agent::rpc_sync(const call_options& o, const worker_ref& to, std::string_view fn,
                            const Args&... args) {
  auto timeout = core_->timeout_of(o);
  auto raw = start_call(o, to, fn, 0, 0, args...);
  if (auto spin = core_->options().busy_poll; spin.count() > 0) {
    auto until = clock::now() + spin;
    while (!raw.is_ready() && clock::now() < until) {
    }
  }
  // The deadline sweeper fails the call at its timeout; the extra second only guards it.
  auto f = raw.get(timeout + std::chrono::seconds(1));
  if (!f) return std::move(f).error();
  return detail::decode_result<R>(std::move(*f), core_.get());
}

template <class T, class... Args>
remote_ref<T> agent::remote(const call_options& o, const worker_ref& to, std::string_view fn,
                            const Args&... args) {
  auto who = core_->find(to);
  auto id = core_->next_rref_id();
  auto created = start_call(o, to, fn, detail::request_as_remote, id, args...);
  if (!who)
    return remote_ref<T>(
        std::make_shared<detail::rref_holder>(core_, worker_info{}, id, std::move(created), false));
  return remote_ref<T>(
      std::make_shared<detail::rref_holder>(core_, *who, id, std::move(created), true));
}

}  // namespace troupe::rpc
