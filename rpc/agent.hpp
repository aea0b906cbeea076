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
#include <tuple>
#include <vector>

#include <troupe/core/future.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/devicemap/derive.hpp>
#include <troupe/rpc/function_table.hpp>
#include <troupe/rpc/membership_event.hpp>
#include <troupe/rpc/options.hpp>
#include <troupe/rpc/remote_ref.hpp>
#include <troupe/rpc/serializer.hpp>
#include <troupe/rpc/worker_ref.hpp>

namespace troupe::rpc {

namespace detail {
class agent_core;  // rpc/detail/agent_core.hpp, not installed: the transport stays inside
/// Writes one call's arguments (`args`, a tuple the template built) into `out`.
using write_args_fn = binary_serializer::result_type (*)(binary_serializer& out, const void* args);
}  // namespace detail

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
  worker_info self() const;
  /// The current members, ordered by id.
  std::vector<worker_info> workers() const;
  /// A member by name, or errc::not_found listing the members.
  expected<worker_info> worker(std::string_view name) const;
  /// A member by id.
  expected<worker_info> worker_by_id(std::int32_t id) const;
  /// True when the group was formed without a world size (workers join and leave).
  bool is_dynamic() const noexcept;
  /// The functions this worker serves.
  function_table& functions();
  /// This worker's reverse device maps and device list (they change as workers join).
  device_setup device_setup_now() const;
  /// The options the agent was made with.
  const rpc_backend_options& options() const noexcept;

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
  bool expel(std::string_view name, std::string_view tag, const error& why);

  /// Calls `l` after every membership change this worker sees (rpc/membership_event.hpp);
  /// returns an id for remove_membership_listener.
  std::uint64_t add_membership_listener(membership_listener l);
  /// Stops calling the listener `id` (an unknown id is ignored).
  void remove_membership_listener(std::uint64_t id);

  /// Remote references this worker owns right now (diagnostics, tests).
  std::size_t owned_remote_refs() const;

 private:
  // What the peer does with a call's result: reply with it, drop it, or keep it as the
  // remote value `rref_id`.
  enum class call_kind : std::uint8_t { reply, one_way, as_remote };
  template <class... Args>
  future<wire::frame> start_call(const call_options& o, const worker_ref& to, std::string_view fn,
                                 call_kind kind, std::uint64_t rref_id, const Args&... args);
  // The templates serialize through `write`; everything else happens here, in agent.cpp.
  future<wire::frame> send_call(const call_options& o, const worker_ref& to, std::string_view fn,
                                call_kind kind, std::uint64_t rref_id, detail::write_args_fn write,
                                const void* args);
  std::shared_ptr<detail::rref_holder> start_remote(const call_options& o, const worker_ref& to,
                                                    std::string_view fn,
                                                    detail::write_args_fn write, const void* args);
  duration timeout_of(const call_options& o) const;
  // rpc_sync's wait: spins for the reply while recent calls were short (options' busy_poll,
  // detail/spin_policy.hpp), then the caller sleeps in get(); note_reply_wait() tells the
  // policy how long the call took from `started`.
  void spin_for_reply(const future<wire::frame>& reply) const;
  void note_reply_wait(clock::time_point started) const;
  // The context replies are decoded in (remote references in results): for a continuation
  // that may outlive the agent (empty once it is gone), and for a caller that holds it.
  std::weak_ptr<detail::rref_context> decode_context() const;
  detail::rref_context* context() const noexcept;
  std::shared_ptr<detail::agent_core> core_;
};

namespace detail {
template <class... Args>
inspect_error write_args(binary_serializer& out, const void* args) {
  return std::apply([&out](const Args&... a) { return out(a...); },
                    *static_cast<const std::tuple<const Args&...>*>(args));
}

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

template <class... Args>
future<void> agent::notify(const call_options& o, const worker_ref& to, std::string_view fn,
                           const Args&... args) {
  return start_call(o, to, fn, call_kind::one_way, 0, args...).then([](wire::frame&&) {});
}

template <class... Args>
future<wire::frame> agent::start_call(const call_options& o, const worker_ref& to,
                                      std::string_view fn, call_kind kind, std::uint64_t rref_id,
                                      const Args&... args) {
  const std::tuple<const Args&...> pack(args...);
  return send_call(o, to, fn, kind, rref_id, &detail::write_args<Args...>, &pack);
}

template <class R, class... Args>
future<R> agent::rpc_async(const call_options& o, const worker_ref& to, std::string_view fn,
                           const Args&... args) {
  return start_call(o, to, fn, call_kind::reply, 0, args...)
      .then([weak = decode_context()](wire::frame&& f) {
        auto ctx = weak.lock();
        return detail::decode_result<R>(std::move(f), ctx.get());
      });
}

template <class R, class... Args>
expected<R> agent::rpc_sync(const call_options& o, const worker_ref& to, std::string_view fn,
                            const Args&... args) {
  auto timeout = timeout_of(o);
  const auto started = clock::now();
  auto raw = start_call(o, to, fn, call_kind::reply, 0, args...);
  spin_for_reply(raw);
  // The deadline sweeper fails the call at its timeout; the extra second only guards it.
  auto f = raw.get(timeout + std::chrono::seconds(1));
  note_reply_wait(started);
  if (!f) return std::move(f).error();
  return detail::decode_result<R>(std::move(*f), context());
}

template <class T, class... Args>
remote_ref<T> agent::remote(const call_options& o, const worker_ref& to, std::string_view fn,
                            const Args&... args) {
  const std::tuple<const Args&...> pack(args...);
  return remote_ref<T>(start_remote(o, to, fn, &detail::write_args<Args...>, &pack));
}

}  // namespace troupe::rpc
