// The one place RPC touches CUDA: copies between GPU memory and host memory for tensors
// that cross the wire. Built against libcudart when troupe is configured with CUDA
// (device_helper_cuda.cpp), else every call reports errc::unavailable
// (device_helper_none.cpp). Copies run on a per-device stream owned by this helper, after
// an event recorded on the stream that produced the data (tensor::stream(), else the
// legacy default stream), and are waited for with a CUDA event on the calling thread (a
// worker or user thread, never an I/O thread); nothing synchronizes a whole device or
// another stream. Pinned host and device buffers come from per-device pools
// (rpc/detail/block_pool.hpp, at most 256 MiB cached each), not from an allocation per
// message.
#pragma once

#include "core/expected.hpp"
#include "rpc/tensor.hpp"

namespace troupe::rpc {

/// True when this build can copy tensors to and from GPUs and a device is present.
bool gpu_copies_available() noexcept;

/// A contiguous copy of GPU tensor `t` in pinned host memory (labelled cpu), taken after
/// the work queued on `t.stream()` so far. Waits for the copy with an event recorded after
/// it on the helper's stream. A non-contiguous GPU tensor is errc::unsupported.
expected<tensor> stage_to_host(const tensor& t);

/// A copy of host tensor `t` on `target` (a cuda device), in memory owned by the result.
expected<tensor> upload_to_device(const tensor& t, device target);

}  // namespace troupe::rpc
