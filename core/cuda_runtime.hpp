// How many CUDA devices this process can use. The one place core touches CUDA; built
// against libcudart when troupe is configured with CUDA, else it reports "built without".
#pragma once

#include <troupe/core/expected.hpp>

namespace troupe {

/// True when this build links the CUDA runtime.
bool built_with_cuda() noexcept;

/// The number of usable CUDA devices (>= 1), or errc::unavailable saying why there are
/// none (built without CUDA, no driver, no device, CUDA_VISIBLE_DEVICES hides them all).
/// Callers that only need a count treat the error as zero devices.
expected<int> cuda_device_count();

}  // namespace troupe
