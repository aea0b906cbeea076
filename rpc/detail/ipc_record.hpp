// The CUDA IPC record (rpc/device_helper.hpp): what a GPU tensor lent to a worker on the
// same host travels as, in place of its bytes. Host-only code, so that any build can read
// the loan id of a record it received (and release it) and the layout is tested without a
// GPU. Layout (docs/rpc-wire.md), little-endian, ipc_record_size bytes:
//   u32 magic "TIPC", u32 version 1, i32 sender pid, i32 sender device, u64 loan id,
//   u64 offset into the allocation, u64 allocation base and u64 event in the sender's
//   process (used only by a receiver in that same process), u8 dtype, u8 rank, 6 bytes
//   zero, i64 shape[16], 64-byte memory handle, 64-byte event handle, 8 bytes zero.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>

namespace troupe::rpc::detail {

struct ipc_record {
  std::int32_t pid = 0;
  std::int32_t source_device = 0;
  std::uint64_t loan_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t base = 0;
  std::uint64_t event = 0;
  dtype type = dtype::uint8;
  std::vector<std::int64_t> shape;
  std::array<std::byte, 64> mem_handle{};
  std::array<std::byte, 64> event_handle{};

  /// Bytes of the tensor the record stands for.
  std::size_t nbytes() const noexcept;
};

/// Zeroed host memory of `n` bytes for a record's bytes (sent or received). A tensor
/// over this memory, and only such a tensor, is an IPC record: RPC's mark needs no flag
/// on core's tensor, and a user's tensor can never pass for a record.
std::shared_ptr<std::byte> allocate_ipc_record(std::size_t n);

/// Whether `t` holds an IPC record (its memory came from allocate_ipc_record) that stands
/// for a GPU tensor lent by a worker on this host, rather than a tensor's own bytes;
/// t.dev() is then the device the lent tensor lands on.
bool is_ipc_record(const tensor& t) noexcept;

/// The record as a u8 host tensor for which is_ipc_record() holds, labelled `target` (the
/// device it lands on). invalid_argument for a rank over 16.
expected<tensor> encode_ipc_record(const ipc_record& r, device target);

/// The record held by `t`. errc::protocol_error naming what is wrong when `t` is not a
/// well-formed record (size, magic, version, dtype, rank, a negative or oversized shape).
expected<ipc_record> decode_ipc_record(const tensor& t);

}  // namespace troupe::rpc::detail
