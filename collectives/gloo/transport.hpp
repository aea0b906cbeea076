// How a gloo group moves the data of its collectives. Internal to collectives/gloo.
//
// A group chooses one transport when it connects (gloo_group.cpp) and runs every
// collective through it; nothing is decided again per operation except what a transport
// decides itself (a size threshold, a tensor that does not split evenly). There are three:
//   - tcp (tcp_transport.hpp): Gloo's own algorithms and the direct ones (direct.hpp)
//     over the group's full mesh of TCP pairs; every group has it, and the others hold
//     it for what they do not run themselves and for point-to-point transfers;
//   - shared memory (shm_transport.hpp): every member on one host, one segment among them
//     (shared_memory.hpp) for allreduce, broadcast, allgather, reduce_scatter and barrier;
//   - hierarchical (hier_transport.hpp): members on several hosts, shared memory within
//     each host and TCP between them (hierarchical.hpp) for allreduce and reduce_scatter.
//
// Threading: the operations are called by the thread running the group's current
// operation only, one at a time; mark_failed() and abort() may be called from any thread
// while one runs. Errors: every operation returns the error it failed with (Gloo's
// exceptions are turned into errors in gloo_errors::guard); after a failure the group
// fails for good, so a transport need not be usable again.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/op_checks.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/core/time.hpp>

namespace troupe::collectives::gloo_transport {

/// One collective as every member numbers it: its place in the group's call order (the
/// shared-memory count and the roll-call key), its Gloo tag (the low 24 bits), and how
/// long its transfers may wait, counted from when each step starts waiting.
struct op_step {
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout{0};
  std::uint64_t seq = 0;
  /// When the operation started running (the group's runner, which makes every step).
  clock::time_point start{};

  /// The deadline of the operation's waits: `timeout` after it started. Taken from the
  /// runner's start rather than read again: the clock's reads were a sixth of a group of
  /// one's allreduce on the 2-vCPU benchmark machine.
  clock::time_point deadline() const { return start + timeout; }
};

/// The group's way of running each collective. Every operation is collective over the
/// members (each calls it with the same step and sizes), in place where it says so. avg
/// combines as sum; allreduce divides by the group's size itself (each transport where the
/// data is still in cache), the other reducing operations leave the division to the
/// caller. The group has already checked the arguments and returned early for empty
/// tensors where the operation has nothing to move.
class transport {
 public:
  virtual ~transport() = default;

  /// "tcp", "shared memory" or "hierarchical", for logs.
  virtual std::string_view name() const noexcept = 0;
  /// Which of those moves the data of operation `op` ("allreduce", "send", ...) of `bytes`
  /// bytes (SIZE_MAX: not given), for its trace span.
  virtual std::string_view carrier(std::string_view op, std::size_t bytes) const noexcept = 0;

  /// Allreduce of `t` in place; `fn` combines (op's function from cpu_reduce); avg's result
  /// is divided by the group's size. Returns at once in a group of one.
  virtual expected<void> allreduce(const op_step& s, tensor_view t, reduce_op op,
                                   const cpu_reduce_fn& fn) = 0;
  /// Broadcast of `t` from member `root`, in place.
  virtual expected<void> broadcast(const op_step& s, tensor_view t, int root) = 0;
  /// Reduce of `t` to member `root`, in place on the root; other members' `t` stays as it was.
  virtual expected<void> reduce(const op_step& s, tensor_view t, int root,
                                const cpu_reduce_fn& fn) = 0;
  /// Member r's `in` lands in block r of `out` on every member.
  virtual expected<void> allgather(const op_step& s, tensor_view in, tensor_view out) = 0;
  /// Member r's `in` lands in block r of the root's `out` (read on the root only).
  virtual expected<void> gather(const op_step& s, tensor_view in, tensor_view out, int root) = 0;
  /// Block r of the root's `in` (read on the root only) lands in member r's `out`.
  virtual expected<void> scatter(const op_step& s, tensor_view in, tensor_view out, int root) = 0;
  /// Block r of the members' `in` (each `out.numel` elements), reduced, lands in member
  /// r's `out`.
  virtual expected<void> reduce_scatter(const op_step& s, tensor_view in, tensor_view out,
                                        reduce_op op, const cpu_reduce_fn& fn) = 0;
  /// All-to-all of equal blocks (`uneven` null) or of the blocks `uneven` gives.
  virtual expected<void> all_to_all(const op_step& s, tensor_view in, tensor_view out,
                                    const a2a_layout* uneven) = 0;
  /// Returns once every member called it.
  virtual expected<void> barrier(const op_step& s) = 0;

  /// Fails every member's operations at once: marks shared memory failed and closes the
  /// TCP connections, so that members still inside an operation fail promptly too. Any
  /// thread; idempotent.
  virtual void mark_failed() noexcept = 0;
  /// Makes this member's current and later waits on shared memory fail with errc::aborted
  /// (waits over TCP end through mark_failed or tcp::fail_pairs). Any thread.
  virtual void abort() noexcept = 0;
};

/// Reduce-scatter for transports without one of their own: allreduces a copy of `in`
/// through `via` and keeps block `rank`.
expected<void> reduce_scatter_by_allreduce(transport& via, const op_step& s, int rank,
                                           tensor_view in, tensor_view out, reduce_op op,
                                           const cpu_reduce_fn& fn);

}  // namespace troupe::collectives::gloo_transport
