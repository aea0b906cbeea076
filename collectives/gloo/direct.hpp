// Collectives of the gloo backend written on Gloo's unbound buffers (its point-to-point
// primitive) instead of Gloo's own algorithms, where those cost more round trips than
// the data needs. Internal to collectives/gloo; run on the group's worker thread.
//
// Every transfer over Gloo's TCP transport is a rendezvous: the receiver announces its
// buffer, the sender's payload follows. Gloo's ring allreduce cuts even a 4 KiB tensor into
// 2 x size segments, each its own rendezvous, and its ring allgather takes size - 1 steps.
// The algorithms here post every receive first and then every send, so each rank pair
// exchanges one message per phase, and the TCP loop thread is woken as rarely as possible.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/core/time.hpp>

namespace gloo {
class Context;
}  // namespace gloo

namespace troupe::collectives::gloo_direct {

/// Scratch memory reused across operations of one group (used only by the thread running
/// the group's current operation), so that large operations do not map and fault in fresh
/// pages each time.
class scratch {
 public:
  /// At least `bytes` bytes, valid until the next call.
  std::byte* get(std::size_t bytes);

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
};

/// One operation: its Gloo context, a slot unique to it, and its deadline. A wait that
/// times out or loses its peer fails the operation with gloo_errors::error_of's error
/// (timeout or connection_lost).
struct op_ctx {
  gloo::Context& context;
  std::uint64_t slot;
  clock::time_point deadline;
  /// The context ranks taking part, in the order the algorithms number them (their fold
  /// order); it must hold this context's rank. Empty: every rank of the context, in order.
  /// Every participant must pass the same list; ranks outside it are not touched.
  std::span<const int> ranks = {};
};

/// The slot of collective number `tag` (24 bits), above every slot Gloo's algorithms use
/// (prefix < 0x10) and below the point-to-point slots (prefix 0xe0).
std::uint64_t slot_of(std::uint32_t tag);

/// Allreduce in place. Small tensors (and, between two ranks, all but the largest): every
/// rank sends its whole tensor to every other and folds all contributions locally. Large
/// tensors: reduce-scatter then allgather, each rank owning one block, both phases direct
/// between all pairs and pipelined in segments. Either way every rank folds the
/// contributions in rank order (r0 op r1 op ...), so all ranks get bit-identical results.
expected<void> allreduce(const op_ctx& op, tensor_view t, const cpu_reduce_fn& fn, scratch& s);

/// Allgather: rank r's `in` lands in block r of `out` (size x in.numel elements) everywhere.
/// One direct transfer per rank pair.
expected<void> allgather(const op_ctx& op, tensor_view in, tensor_view out);

/// Tensors up to this many bytes take the one-step exchange in allreduce.
inline constexpr std::size_t exchange_max_bytes = 256 << 10;
/// With two participants, up to this many bytes: there the exchange moves the same bytes
/// as reduce-scatter + allgather (the whole tensor each way) in one step instead of two
/// dependent ones. Between two simulated hosts (the hierarchical path's step across) it took
/// 0.80x the time at 1 MiB and 0.98x at 4 MiB (bench/RESULTS.md). Above it the pipelined
/// algorithm keeps the scratch to a few segments instead of a copy of the tensor.
inline constexpr std::size_t exchange_pair_max_bytes = std::size_t{64} << 20;

}  // namespace troupe::collectives::gloo_direct
