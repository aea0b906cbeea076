// Options of every collective. Each carries a timeout: the operation fails with
// errc::timeout (naming the group and the ranks that did not arrive) once it passes.
// `stream` matters to CUDA backends only: the caller's cudaStream_t (null: the default
// stream). The operation starts after the work queued there and the stream waits for the
// operation, so kernels queued on it later see the result; the host is not blocked.
#pragma once

#include <cstdint>
#include <vector>

#include <troupe/collectives/tensor.hpp>
#include <troupe/core/time.hpp>

namespace troupe::collectives {

/// The timeout a default-built options object uses.
inline duration default_op_timeout() { return default_timeout(); }

struct allreduce_options {
  reduce_op op = reduce_op::sum;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct broadcast_options {
  int root = 0;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct reduce_options {
  int root = 0;
  reduce_op op = reduce_op::sum;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct allgather_options {
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct gather_options {
  int root = 0;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct scatter_options {
  int root = 0;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct reduce_scatter_options {
  reduce_op op = reduce_op::sum;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct all_to_all_options {
  /// Uneven splits: elements sent to / received from each rank. Both empty means equal
  /// splits (numel / size each); otherwise both must have size() entries.
  std::vector<std::size_t> send_counts;
  std::vector<std::size_t> recv_counts;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct barrier_options {
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};
struct p2p_options {
  /// Matches a send with a recv between the same two ranks; 0 to 65535.
  std::uint32_t tag = 0;
  duration timeout = default_op_timeout();
  void* stream = nullptr;
};

}  // namespace troupe::collectives
