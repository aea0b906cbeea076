// The tcp transport of a gloo group (transport.hpp): Gloo's full mesh of TCP pairs, with
// Gloo's own algorithms for reduce, gather, scatter, all-to-all, broadcast and barrier and
// the direct ones (direct.hpp) for allreduce and allgather. Every group connects it; the
// shared-memory and hierarchical transports hold it for what they leave to TCP, and the
// group posts its point-to-point transfers on it. Internal to collectives/gloo.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <troupe/collectives/gloo/direct.hpp>
#include <troupe/collectives/gloo/full_mesh.hpp>
#include <troupe/collectives/gloo/transport.hpp>
#include <troupe/store/store.hpp>

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace troupe::collectives::gloo_transport {

struct tcp_options {
  int rank = 0;
  int size = 1;
  /// The address the device binds and the others connect to.
  std::string host;
  /// Each wait of the connect, and the default of Gloo's own waits.
  duration timeout = std::chrono::seconds(30);
  /// Where the members publish their pairs' addresses (namespaced for this connect).
  std::shared_ptr<troupe::store> rendezvous;
  /// Polled while connecting; an error ends the connect with it (may be empty).
  gloo_mesh::interrupt_fn interrupt;
};

class tcp final : public transport {
 public:
  /// Creates the device (its loop thread set to SCHED_BATCH) and connects a pair to every
  /// other member through `o.rendezvous`, each wait bounded by `o.timeout`, then sizes the
  /// local pairs' send buffers (os_tuning.hpp). Collective over the members. Fails with
  /// Gloo's error, or the interrupt's.
  static expected<std::shared_ptr<tcp>> connect(const tcp_options& o);

  ~tcp() override;

  std::string_view name() const noexcept override { return "tcp"; }
  std::string_view carrier(std::string_view, std::size_t) const noexcept override { return "tcp"; }

  expected<void> allreduce(const op_step& s, tensor_view t, reduce_op op,
                           const cpu_reduce_fn& fn) override;
  expected<void> broadcast(const op_step& s, tensor_view t, int root) override;
  expected<void> reduce(const op_step& s, tensor_view t, int root,
                        const cpu_reduce_fn& fn) override;
  expected<void> allgather(const op_step& s, tensor_view in, tensor_view out) override;
  expected<void> gather(const op_step& s, tensor_view in, tensor_view out, int root) override;
  expected<void> scatter(const op_step& s, tensor_view in, tensor_view out, int root) override;
  expected<void> reduce_scatter(const op_step& s, tensor_view in, tensor_view out, reduce_op op,
                                const cpu_reduce_fn& fn) override;
  expected<void> all_to_all(const op_step& s, tensor_view in, tensor_view out,
                            const a2a_layout* uneven) override;
  expected<void> barrier(const op_step& s) override;

  /// Closes every connection: waits on them, this member's and its peers', fail.
  void mark_failed() noexcept override;
  /// Nothing to do: waits over TCP end through mark_failed() and fail_pairs().
  void abort() noexcept override {}

  /// Fails every operation waiting on the pairs at once with `why`, as a peer's closed
  /// connection would (closing them does not end a receive already posted; see
  /// gloo_mesh::fail_pair). Any thread.
  void fail_pairs(const std::string& why) noexcept;

  /// Posts a send (`is_send`) or receive of `t` with `peer` under point-to-point tag `tag`
  /// (below 65536; its slot lies above every collective's) and returns the buffer to wait
  /// on: waitSend or waitRecv, then abortWaitSend or abortWaitRecv to end that wait early.
  expected<std::unique_ptr<gloo::transport::UnboundBuffer>> post(tensor_view t, int peer,
                                                                 std::uint32_t tag, bool is_send);

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  gloo::Context& context() const noexcept { return *context_; }

 private:
  tcp() = default;
  gloo_direct::op_ctx direct_op(const op_step& s) const;

  int rank_ = 0;
  int size_ = 1;
  // Declared before the context, which is released first.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  gloo_direct::scratch scratch_;  // the thread running the group's operation only
};

/// A transport that keeps the group's tcp transport for what it does not run itself: by
/// default every collective goes to `tcp`, and a derived transport overrides the ones it
/// runs its own way (shared memory, hierarchical). mark_failed() fails the TCP pairs too.
class over_tcp : public transport {
 public:
  explicit over_tcp(std::shared_ptr<tcp> t) : tcp_(std::move(t)) {}

  expected<void> allreduce(const op_step& s, tensor_view t, reduce_op op,
                           const cpu_reduce_fn& fn) override {
    return tcp_->allreduce(s, t, op, fn);
  }
  expected<void> broadcast(const op_step& s, tensor_view t, int root) override {
    return tcp_->broadcast(s, t, root);
  }
  expected<void> reduce(const op_step& s, tensor_view t, int root,
                        const cpu_reduce_fn& fn) override {
    return tcp_->reduce(s, t, root, fn);
  }
  expected<void> allgather(const op_step& s, tensor_view in, tensor_view out) override {
    return tcp_->allgather(s, in, out);
  }
  expected<void> gather(const op_step& s, tensor_view in, tensor_view out, int root) override {
    return tcp_->gather(s, in, out, root);
  }
  expected<void> scatter(const op_step& s, tensor_view in, tensor_view out, int root) override {
    return tcp_->scatter(s, in, out, root);
  }
  expected<void> reduce_scatter(const op_step& s, tensor_view in, tensor_view out, reduce_op op,
                                const cpu_reduce_fn& fn) override {
    return tcp_->reduce_scatter(s, in, out, op, fn);
  }
  expected<void> all_to_all(const op_step& s, tensor_view in, tensor_view out,
                            const a2a_layout* uneven) override {
    return tcp_->all_to_all(s, in, out, uneven);
  }
  expected<void> barrier(const op_step& s) override { return tcp_->barrier(s); }
  void mark_failed() noexcept override { tcp_->mark_failed(); }

 protected:
  std::shared_ptr<tcp> tcp_;
};

}  // namespace troupe::collectives::gloo_transport
