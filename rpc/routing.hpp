// Device routing of tensors that cross the wire: which device a tensor lands on at the
// peer (device maps on the way out, reverse maps on the way back), and the host-side
// preparation before the bytes are written.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>
#include <troupe/devicemap/device_map.hpp>

namespace troupe::rpc {

/// Direction of a frame, which decides which map applies and what the error says.
enum class route_kind {
  /// Arguments of a call: this worker's device_maps[peer].
  request,
  /// A result going back to the caller: this worker's reverse map for the caller.
  reply,
};

/// The device at worker `peer` that a tensor on `source` of worker `self` lands on.
/// `map` may be null (no map for that peer). A mapped source goes where the map says; an
/// unmapped CPU tensor stays on the CPU; an unmapped GPU tensor is refused with
/// errc::invalid_argument saying which map entry to add.
expected<device> route_device(device source, std::string_view self, std::string_view peer,
                              const device_map* map, route_kind kind);

/// Where GPU tensors bound for a GPU of a worker on this host may be lent through CUDA IPC
/// instead of staged (rpc/device_helper.hpp): the sender's book of loans, which keeps each
/// lent tensor alive until the receiver releases it (kind::ipc_release).
class ipc_lender {
 public:
  virtual ~ipc_lender() = default;
  /// A fresh loan id (never 0).
  virtual std::uint64_t next_loan_id() = 0;
  /// Keeps `keep` until loan `id` is released (or expires).
  virtual void file_loan(std::uint64_t id, std::shared_ptr<void> keep) = 0;
};

/// Makes `ts` ready for the frame builder: each tensor gets its target device as label and
/// its bytes in contiguous host memory (GPU tensors staged through pinned memory,
/// strided CPU views packed; contiguous CPU tensors are used in place, no copy). With a
/// `lender` (the peer is on this host), a GPU tensor bound for a GPU travels as a CUDA
/// IPC record instead, filed with the lender; memory that cannot be shared is staged.
expected<void> prepare_outgoing(std::vector<tensor>& ts, std::string_view self,
                                std::string_view peer, const device_map* map, route_kind kind,
                                ipc_lender* lender = nullptr);

/// True when some received tensor must be moved to a GPU before use.
bool needs_placement(const std::vector<tensor>& ts) noexcept;

/// Moves received tensors labelled with a GPU onto it. `device_count` is this worker's; a
/// device it does not have is errc::invalid_argument naming the worker and the device.
/// Tensors that arrived as CUDA IPC records are copied from the lender's memory, and
/// `release` is called with each record's loan id once it is no longer read (copied, or
/// the placement failed), so that the lender can drop it.
expected<void> place_incoming(std::vector<tensor>& ts, std::string_view self, int device_count,
                              const std::function<void(std::uint64_t)>& release = {});

}  // namespace troupe::rpc
