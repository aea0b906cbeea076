// Element-wise reductions on CPU memory, for every dtype: the combine step Gloo's
// algorithms call, and the division that turns a sum into an average.
#pragma once

#include <cstddef>
#include <functional>

#include <troupe/collectives/tensor.hpp>

namespace troupe::collectives {

/// out[i] = a[i] (op) b[i] for n elements; out may alias a or b.
using cpu_reduce_fn = std::function<void(void* out, const void* a, const void* b, std::size_t n)>;

/// Whether the CPU reductions support `op` on `type`: everything except avg on integers
/// (an integer average would silently truncate).
bool cpu_supports(dtype type, reduce_op op) noexcept;

/// The combine function of `op` on `type` (avg combines as sum), or errc::unsupported.
expected<cpu_reduce_fn> cpu_reduce(dtype type, reduce_op op);

/// Divides every element of the CPU view `t` by `divisor` (floating dtypes only).
void cpu_divide(tensor_view t, std::size_t divisor);

}  // namespace troupe::collectives
