// remote_ref<T>: a reference to a value that lives on (is owned by) another worker, made
// by agent::remote(). Copies in one process share one holder; when the last copy in this
// process is dropped, the owner is told once and frees the value when no holder is left
// anywhere. A remote_ref is sendable (as an RPC argument or result, also inside user
// types): the receiver gets its own share, counted by the owner before the sender can
// drop its own (see docs/rpc.md, "Remote references").
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>

#include <troupe/core/future.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/serializer.hpp>
#include <troupe/rpc/wire.hpp>

namespace troupe::rpc {

namespace detail {

class agent_core;
class rref_holder;

/// What the serializer needs from the agent to send and receive remote references.
class rref_context : public inspect_context {
 public:
  /// Sending: a new share ("fork") of `h` for the receiver of the message being written.
  /// The owner is told about it before the message leaves (never after the sender could
  /// drop its own share). Fails where no receiver is known.
  virtual expected<std::uint64_t> fork_rref(const std::shared_ptr<rref_holder>& h) = 0;
  /// Receiving: this process's holder of share `fork` of reference `id` owned by `owner`.
  virtual expected<std::shared_ptr<rref_holder>> adopt_rref(const worker_info& owner,
                                                            std::uint64_t id,
                                                            std::uint64_t fork) = 0;
};

/// One share of a remote reference, held by this process. `fork` 0 is the creator's share;
/// a received reference holds the fork its sender announced to the owner.
class rref_holder {
 public:
  rref_holder(std::shared_ptr<agent_core> core, worker_info owner, std::uint64_t id,
              future<wire::frame> created, bool counted, std::uint64_t fork = 0);
  ~rref_holder();
  rref_holder(const rref_holder&) = delete;
  rref_holder& operator=(const rref_holder&) = delete;

  const worker_info& owner() const noexcept { return owner_; }
  std::uint64_t id() const noexcept { return id_; }
  std::uint64_t fork() const noexcept { return fork_; }
  /// False when the owner never got the reference (the creating call could not be sent).
  bool counted() const noexcept { return counted_; }
  /// The agent as a context for decoding values that contain references (null when gone).
  std::shared_ptr<rref_context> context() const;
  /// The owner's acknowledgement that the value exists (or the creation error).
  expected<void> wait_created(duration timeout);
  future<wire::frame> fetch(duration timeout);

 private:
  std::weak_ptr<agent_core> core_;
  worker_info owner_;
  std::uint64_t id_;
  std::mutex mu_;
  future<wire::frame> created_;
  std::optional<expected<void>> creation_;
  bool counted_;
  std::uint64_t fork_;
};

}  // namespace detail

template <class T>
class remote_ref {
 public:
  remote_ref() = default;
  explicit remote_ref(std::shared_ptr<detail::rref_holder> h) : h_(std::move(h)) {}

  /// The worker that owns the value.
  worker_info owner() const { return h_ ? h_->owner() : worker_info{}; }
  bool valid() const noexcept { return h_ != nullptr; }

  /// Fetches a copy of the value (the owner keeps it). Fails with the error the remote
  /// function produced, or with errc::timeout after `timeout` (default: TROUPE_DEFAULT_TIMEOUT's,
  /// 5 minutes unless set).
  expected<T> to_here(duration timeout = default_timeout()) const {
    if (!h_) return make_error(errc::invalid_argument, "an empty remote_ref has no value");
    auto until = deadline::after(timeout);
    TROUPE_TRY(h_->wait_created(until.remaining()));
    auto f = h_->fetch(until.remaining()).get(until.remaining() + std::chrono::seconds(1));
    if (!f) return std::move(f).error();
    T value{};
    auto ctx = h_->context();
    TROUPE_TRY(deserialize_with(ctx.get(), f->message, &f->tensors, value));
    return value;
  }

  /// This process's share (for the serializer; empty for an empty reference).
  const std::shared_ptr<detail::rref_holder>& holder() const noexcept { return h_; }

 private:
  std::shared_ptr<detail::rref_holder> h_;
};

/// Sends a remote_ref as u8 present, then worker_info owner, u64 id, u64 fork; the receiver
/// becomes a holder of that fork. Only troupe's RPC inspectors can carry one (they reach
/// the agent through their context).
template <class Inspector, class T>
requires(std::is_same_v<Inspector, binary_serializer> ||
         std::is_same_v<Inspector, binary_deserializer>) typename Inspector::result_type
    inspect(Inspector& f, remote_ref<T>& r) {
  using result = typename Inspector::result_type;
  auto* ctx = dynamic_cast<detail::rref_context*>(f.context());
  if constexpr (Inspector::reads_state) {
    std::uint8_t present = r.valid() ? 1 : 0;
    if (auto e = f(present); e || !present) return e;
    if (!ctx)
      return result(make_error(errc::unsupported,
                               "a remote_ref can only be sent as an RPC argument or "
                               "result (rpc_sync, rpc_async, notify, remote)"));
    auto fork = ctx->fork_rref(r.holder());
    if (!fork) return result(std::move(fork).error());
    worker_info owner = r.holder()->owner();
    std::uint64_t id = r.holder()->id();
    return f(owner, id, *fork);
  } else {
    std::uint8_t present = 0;
    if (auto e = f(present)) return e;
    if (present > 1)
      return result(make_error(errc::protocol_error, "a remote_ref flag holds ", int(present)));
    if (!present) {
      r = remote_ref<T>();
      return {};
    }
    worker_info owner;
    std::uint64_t id = 0, fork = 0;
    if (auto e = f(owner, id, fork)) return e;
    if (!ctx)
      return result(make_error(errc::unsupported,
                               "a remote_ref can only be received as an RPC argument or "
                               "result"));
    auto h = ctx->adopt_rref(owner, id, fork);
    if (!h) return result(std::move(h).error());
    r = remote_ref<T>(std::move(*h));
    return {};
  }
}

}  // namespace troupe::rpc
