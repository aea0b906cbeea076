// The one place RPC touches CUDA: copies between GPU memory and host memory for tensors
// that cross the wire. Built against libcudart when troupe is configured with CUDA
// (device_helper_cuda.cpp), else every call reports errc::unavailable
// (device_helper_none.cpp). Copies run on a per-device stream owned by this helper, after
// an event recorded on the stream that produced the data (tensor::stream(), else the
// legacy default stream), and are waited for with a CUDA event on the calling thread (a
// worker or user thread, never an I/O thread); nothing synchronizes a whole device or
// another stream. Pinned host and device buffers come from per-device pools
// (rpc/detail/block_pool.hpp, at most 256 MiB cached each), not from an allocation per
// message. Received tensors bound for a GPU land in that pinned memory straight from the
// socket (receive_buffer), so their upload is a single DMA copy.
#pragma once

#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>

namespace troupe::rpc {

/// True when this build can copy tensors to and from GPUs and a device is present.
bool gpu_copies_available() noexcept;

/// A contiguous copy of GPU tensor `t` in pinned host memory (labelled cpu), taken after
/// the work queued on `t.stream()` so far. Waits for the copy with an event recorded after
/// it on the helper's stream. A non-contiguous GPU tensor is errc::unsupported.
expected<tensor> stage_to_host(const tensor& t);

/// A copy of host tensor `t` on `target` (a cuda device), in memory owned by the result.
/// Fastest when `t` lives in memory from receive_buffer (page-locked: one DMA copy).
expected<tensor> upload_to_device(const tensor& t, device target);

/// Memory for the bytes of a received tensor bound for `dev`: for a CUDA device of this
/// process and at least receive_buffer_min bytes, a page-locked block from that device's
/// pool, so the upload that follows is one DMA copy; null otherwise (no CUDA, no such
/// device, a small tensor, or the pool cannot allocate), and the caller allocates
/// ordinary memory. Called on I/O threads: it never waits for a device.
std::shared_ptr<std::byte> receive_buffer(device dev, std::size_t bytes) noexcept;

/// The size from which received GPU-bound tensors land in page-locked memory.
inline constexpr std::size_t receive_buffer_min = std::size_t{64} << 10;

// GPU -> GPU between workers on one host without the host (what TensorPipe's cuda_ipc
// channel does): the sender lends its tensor's memory through a CUDA IPC handle plus an
// interprocess event recorded after the work queued on t.stream(); the receiver opens the
// handle, orders a device-to-device copy after that event, and then releases the loan.
// The record travels in place of the bytes (ipc_record_size bytes, a u8 host tensor whose
// memory marks it as a record, rpc/detail/ipc_record.hpp); it also carries the sender's pid, so
// that a receiver in the same process uses the pointer and event directly (CUDA refuses to open its
// own handles).

/// Bytes of an IPC record on the wire.
inline constexpr std::size_t ipc_record_size = 320;

/// A lent tensor: `record` travels, `keep` holds the source memory and the event until
/// the receiver releases the loan.
struct ipc_loan {
  tensor record;
  std::shared_ptr<void> keep;
};

/// Lends contiguous GPU tensor `t` to land on `target` at the receiver, as loan `id`.
/// errc::unsupported when its memory cannot be shared (not from cudaMalloc: a
/// stream-ordered pool, managed memory) or this build has no CUDA: the caller stages it.
expected<ipc_loan> lend_through_ipc(const tensor& t, device target, std::uint64_t id);

/// The loan id in an IPC record, 0 when it is not a well-formed record.
std::uint64_t ipc_record_loan_id(const tensor& record) noexcept;

/// The tensor an IPC record stands for, copied onto the record's device (record.dev())
/// into memory owned by the result, after the lender's event; the calling thread waits
/// for the copy. A malformed record is errc::protocol_error; a handle CUDA will not open
/// is errc::unavailable saying to turn rpc_backend_options::cuda_ipc off.
expected<tensor> receive_through_ipc(const tensor& record);

}  // namespace troupe::rpc
