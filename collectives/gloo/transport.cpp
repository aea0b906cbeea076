#include <troupe/collectives/gloo/transport.hpp>

#include <cstring>
#include <vector>

namespace troupe::collectives::gloo_transport {

expected<void> reduce_scatter_by_allreduce(transport& via, const op_step& s, int rank,
                                           tensor_view in, tensor_view out, reduce_op op,
                                           const cpu_reduce_fn& fn) {
  // Gloo has no reduce-scatter taking a reduce function: allreduce a copy, keep a block.
  std::vector<std::byte> scratch(static_cast<std::byte*>(in.data),
                                 static_cast<std::byte*>(in.data) + in.nbytes());
  tensor_view all = in;
  all.data = scratch.data();
  // avg is divided by the caller, in the block it keeps: allreduce it as a sum.
  TROUPE_TRY(via.allreduce(s, all, op == reduce_op::avg ? reduce_op::sum : op, fn));
  auto mine = all.slice(static_cast<std::size_t>(rank) * out.numel, out.numel);
  std::memcpy(out.data, mine.data, out.nbytes());
  return ok();
}

}  // namespace troupe::collectives::gloo_transport
