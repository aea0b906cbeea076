// Element-wise reductions on CPU memory, for every dtype: the combine step Gloo's
// algorithms call, and the division that turns a sum into an average.
#pragma once

#include <cstddef>

#include <troupe/collectives/tensor.hpp>

namespace troupe::collectives {

/// out[i] = a[i] (op) b[i] for n elements; out may alias a or b. A plain function: an
/// operation's body copies it, and a std::function there cost an allocation per operation.
using cpu_reduce_fn = void (*)(void* out, const void* a, const void* b, std::size_t n);

/// Whether the CPU reductions support `op` on `type`: everything except avg on integers
/// (an integer average would silently truncate).
bool cpu_supports(dtype type, reduce_op op) noexcept;

/// Which loops the reductions run: the fastest this CPU has (AVX2 and F16C where it has
/// them), or the baseline x86-64 ones. Both give the same bits for every input, except
/// which NaN a sum or product of two NaNs passes on (the compiler's choice of operand
/// order); tests compare them.
enum class cpu_isa { best, baseline };

/// The combine function of `op` on `type` (avg combines as sum), or errc::unsupported.
expected<cpu_reduce_fn> cpu_reduce(dtype type, reduce_op op, cpu_isa isa = cpu_isa::best);

/// Divides every element of the CPU view `t` by `divisor` (floating dtypes only).
void cpu_divide(tensor_view t, std::size_t divisor, cpu_isa isa = cpu_isa::best);

}  // namespace troupe::collectives
