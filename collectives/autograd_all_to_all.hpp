// autograd_all_to_all: an all_to_all with a matching backward, for an autograd engine.
//
// The forward sends block i of the input to rank i and stores the block that rank j sent
// in block j of the output. Its gradient is the same exchange run the other way: block j
// of the output's gradient goes back to rank j, where it lands in the position of the
// input block that produced it. So the backward is an all_to_all of the gradients with
// the send and receive split sizes swapped.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <troupe/collectives/options.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/collectives/work.hpp>

namespace troupe::collectives {

/// Per-call settings of a differentiable all_to_all; the split sizes belong to the
/// function object, not to the call.
struct autograd_all_to_all_options {
  duration timeout = default_op_timeout();
  /// The caller's cudaStream_t for CUDA backends (null: the default stream).
  void* stream = nullptr;
};

class autograd_all_to_all {
 public:
  /// Equal splits: every rank sends and receives numel / size() elements per peer.
  /// `group` must not be null; it is kept alive by the function object.
  explicit autograd_all_to_all(std::shared_ptr<process_group> group);

  /// Uneven splits: `send_counts[i]` elements of the input go to rank i and
  /// `recv_counts[j]` elements of the output come from rank j. Fails with
  /// invalid_argument when `group` is null or either list does not have exactly size()
  /// entries; the message names the expected and the actual count.
  static expected<autograd_all_to_all> make(std::shared_ptr<process_group> group,
                                            std::vector<std::size_t> send_counts,
                                            std::vector<std::size_t> recv_counts);

  /// Runs the forward exchange of `input` into `output`. Every member of the group calls
  /// it in the same order as its other collectives. With uneven splits `input` must hold
  /// sum(send_counts) elements and `output` sum(recv_counts); with equal splits both hold
  /// the same number, divisible by size(). Same dtype on both. A size or dtype mismatch
  /// returns a work already failed with invalid_argument (naming the expected and the
  /// actual element counts) and sends nothing. The caller keeps both buffers alive until
  /// the work completes.
  work forward(tensor_view input, tensor_view output, const autograd_all_to_all_options& o = {});

  /// Runs the backward exchange: `grad_output` (shaped like the forward's output) is sent
  /// with the receive counts as send counts, and `grad_input` (shaped like the forward's
  /// input) receives with the send counts as receive counts. Each gradient element ends
  /// on the rank and at the position of the input element it belongs to. With equal
  /// splits, once forward has been called, the gradients must also match its element
  /// count. Mismatches fail the work with invalid_argument before anything is sent.
  work backward(tensor_view grad_output, tensor_view grad_input,
                const autograd_all_to_all_options& o = {});

  const std::shared_ptr<process_group>& group() const noexcept { return group_; }
  /// True when built with equal splits.
  bool equal_splits() const noexcept { return send_counts_.empty(); }
  /// The forward's send and receive counts (empty with equal splits).
  const std::vector<std::size_t>& send_counts() const noexcept { return send_counts_; }
  const std::vector<std::size_t>& recv_counts() const noexcept { return recv_counts_; }

 private:
  autograd_all_to_all(std::shared_ptr<process_group> group, std::vector<std::size_t> send,
                      std::vector<std::size_t> recv);
  // Checks one exchange and runs it; `sends`/`recvs` are the counts of this direction.
  work run(std::string_view what, tensor_view in, tensor_view out,
           const std::vector<std::size_t>& sends, const std::vector<std::size_t>& recvs,
           const autograd_all_to_all_options& o);

  std::shared_ptr<process_group> group_;
  std::vector<std::size_t> send_counts_;
  std::vector<std::size_t> recv_counts_;
  // The forward's element count with equal splits, checked again by backward.
  std::optional<std::size_t> forward_numel_;
};

}  // namespace troupe::collectives
