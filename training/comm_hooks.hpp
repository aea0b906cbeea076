// Communication hooks: how one gradient bucket is reduced across the ranks. A hook gets
// the bucket's flat buffer and must leave in it the sum over the ranks divided by
// `divisor` (the average gradient) by the time its future completes. Every rank runs the
// same hook on its buckets in the same order; joined ranks run it on zero buffers.
//
//   ddp_options o;
//   o.hook = fp16_compress_hook();                    // or bf16_compress_hook()
//   o.hook = [](comm_bucket b) { ... return future; }  // a user hook
#pragma once

#include <functional>

#include <troupe/collectives/process_group.hpp>
#include <troupe/core/future.hpp>

namespace troupe::training {

/// What a hook is given for one bucket. The buffer stays valid until the future completes.
struct comm_bucket {
  /// The bucket's number (launch order, the same on every rank).
  std::size_t index = 0;
  /// The bucket's gradients, flat; holds this rank's contribution on entry.
  tensor_view buffer;
  /// Divide the sum by this: the world size, or the ranks still training under Join
  /// with divide_by_initial_world_size = false.
  double divisor = 1;
  collectives::process_group* group = nullptr;
  /// Bound of the hook's collectives.
  duration timeout = default_timeout();
};

using comm_hook = std::function<future<void>(comm_bucket)>;

/// All-reduces the bucket as it is (the default): the group's average when the divisor is
/// the group size, else a pre-scaled sum.
comm_hook allreduce_hook();

/// Compresses float32/float64 buckets to IEEE half precision (after dividing by the
/// divisor, to keep the sum in range), all-reduces them, and writes the result back in
/// the bucket's own dtype. Halves the bytes sent; values lose precision (~3 digits).
comm_hook fp16_compress_hook();

/// The same with bfloat16: float32's range, ~2-3 significant digits.
comm_hook bf16_compress_hook();

/// Looks a built-in hook up by name: "allreduce", "fp16_compress", "bf16_compress";
/// an unknown name is not_found listing these.
expected<comm_hook> find_comm_hook(std::string_view name);

}  // namespace troupe::training
