// remote_ref<T>: a reference to a value that lives on (is owned by) another worker, made
// by agent::remote(). Copies share one holder; when the last copy in this process is
// dropped, the owner is told once and frees the value when no holder is left anywhere.
// The owner counts holders (see docs/rpc.md, "Remote references").
#pragma once

#include <memory>

#include "core/future.hpp"
#include "core/worker_info.hpp"
#include "rpc/serializer.hpp"
#include "rpc/wire.hpp"

namespace troupe::rpc {

namespace detail {

class agent_core;

/// One process's share of a remote reference.
class rref_holder {
 public:
  rref_holder(std::shared_ptr<agent_core> core, worker_info owner, std::uint64_t id,
              future<wire::frame> created, bool counted);
  ~rref_holder();
  rref_holder(const rref_holder&) = delete;
  rref_holder& operator=(const rref_holder&) = delete;

  const worker_info& owner() const noexcept { return owner_; }
  std::uint64_t id() const noexcept { return id_; }
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
  /// function produced, or with errc::timeout after `timeout`.
  expected<T> to_here(duration timeout = std::chrono::seconds(60)) const {
    if (!h_) return make_error(errc::invalid_argument, "an empty remote_ref has no value");
    auto until = deadline::after(timeout);
    TROUPE_TRY(h_->wait_created(until.remaining()));
    auto f = h_->fetch(until.remaining()).get(until.remaining() + std::chrono::seconds(1));
    if (!f) return std::move(f).error();
    T value{};
    TROUPE_TRY(deserialize(f->message, &f->tensors, value));
    return value;
  }

 private:
  std::shared_ptr<detail::rref_holder> h_;
};

}  // namespace troupe::rpc
