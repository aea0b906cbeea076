// nccl_comm: the lifecycle of one NCCL communicator. Created non-blocking
// (config.blocking = 0) so that every step can be bounded by a deadline; finalized on
// an orderly end, aborted on failure or when finalizing does not finish in time.
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe::collectives {

/// The shrinkFlags of ncclCommShrink for a plan that does or does not abort the parent's
/// operations first: NCCL_SHRINK_ABORT or NCCL_SHRINK_DEFAULT.
int nccl_shrink_flags(bool abort_first) noexcept;

class nccl_comm {
 public:
  /// Joins the communicator of `nranks` ranks identified by `id` as `rank`, on the
  /// current CUDA device. Aborts and fails with errc::timeout when `timeout` passes.
  static expected<std::unique_ptr<nccl_comm>> init(int nranks, const ncclUniqueId& id, int rank,
                                                   const std::string& name, duration timeout);

  /// ncclCommSplit: collective over this communicator. A negative color joins no child
  /// (null result).
  expected<std::unique_ptr<nccl_comm>> split(int color, int key, const std::string& name,
                                             duration timeout);

  /// ncclCommShrink: collective over the members that stay (the `excluded` old ranks do
  /// not call it); the survivors keep their order with dense new ranks. `abort_first`
  /// passes NCCL_SHRINK_ABORT (the parent's operations are ended first), else
  /// NCCL_SHRINK_DEFAULT. The function is looked up at run time: fails with unavailable,
  /// saying so, when the NCCL library in this process has none (older than 2.27).
  expected<std::unique_ptr<nccl_comm>> shrink(const std::vector<int>& excluded, bool abort_first,
                                              const std::string& name, duration timeout);

  /// The version of the NCCL library in this process (ncclGetVersion, e.g. 22809), or 0
  /// when it cannot say.
  static int library_version() noexcept;
  /// Whether the NCCL library in this process has ncclCommShrink: version 2.27 or newer
  /// and the symbol present.
  static bool can_shrink() noexcept;

  ~nccl_comm();
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;

  ncclComm_t get() const noexcept { return comm_; }
  /// The communicator's asynchronous state (ncclCommGetAsyncError); ok while healthy.
  expected<void> async_status() const;
  /// After a call answered ncclInProgress: polls until the communicator is ready again.
  expected<void> wait_ready(std::string_view call, duration timeout) const;
  /// Maps the result of an NCCL call, waiting out ncclInProgress up to `timeout`.
  expected<void> check(ncclResult_t r, std::string_view call, duration timeout) const;

  /// Flushes outstanding work and releases the communicator; aborts if that does not
  /// finish within `timeout`. Idempotent.
  expected<void> finalize(duration timeout);
  /// Cancels everything in flight and releases the communicator. Idempotent, thread-safe.
  void abort() noexcept;
  bool aborted() const noexcept { return state_.load() == state::aborted; }

 private:
  enum class state { live, finalized, aborted };
  explicit nccl_comm(ncclComm_t c, std::string name) : comm_(c), name_(std::move(name)) {}
  /// The config of a new communicator named `name`. NCCL keeps the name's pointer as the
  /// communicator's commName for its whole life: pass the new nccl_comm's own name_.
  static ncclConfig_t config(const std::string& name);
  /// After ncclCommSplit or ncclCommShrink on this (non-blocking) communicator answered
  /// `r`: waits until NCCL's own thread has created the child and written its handle into
  /// *slot (null: no child, for NCCL_SPLIT_NOCOLOR). Those calls return before that write,
  /// even with ncclSuccess, so the slot is a heap cell; on a timeout it is left to NCCL.
  expected<ncclComm_t> await_child(std::unique_ptr<ncclComm_t>& slot, ncclResult_t r,
                                   std::string_view call, duration timeout) const;

  ncclComm_t comm_;
  std::string name_;
  std::atomic<state> state_{state::live};
};

}  // namespace troupe::collectives
