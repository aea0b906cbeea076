// Argument checks shared by every backend, so that each rejects the same mistakes with
// the same messages before anything is sent.
#pragma once

#include <vector>

#include <troupe/collectives/process_group.hpp>

namespace troupe::collectives {

/// Counts and offsets (in elements) of an all_to_all, per peer.
struct a2a_layout {
  std::vector<std::size_t> send_counts, send_offsets, recv_counts, recv_offsets;
};

expected<void> check_root(const process_group& g, int root, std::string_view op);
expected<void> check_peer(const process_group& g, int peer, std::string_view op);
expected<void> check_reduce(const process_group& g, const tensor_view& t, reduce_op op,
                            std::string_view what);
/// `big` must hold size() times `small`'s elements, same dtype (allgather, gather,
/// scatter, reduce_scatter). `big_used` is false on ranks whose `big` is ignored.
expected<void> check_blocks(const process_group& g, const tensor_view& small,
                            const tensor_view& big, bool big_used, std::string_view op);
expected<a2a_layout> check_all_to_all(const process_group& g, const tensor_view& in,
                                      const tensor_view& out, const all_to_all_options& o);

}  // namespace troupe::collectives
