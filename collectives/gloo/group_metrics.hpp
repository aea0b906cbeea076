// The metrics a gloo group keeps (docs/metrics.md): its queue depth, and the time, bytes
// and count of the collectives that succeeded. Internal to collectives/gloo.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string_view>
#include <utility>

#include <troupe/core/metrics.hpp>

namespace troupe::collectives::gloo_metrics {

/// Collectives queued on gloo groups, not yet started (one gauge for the process).
metrics::gauge& queue_depth();

/// One group's cache of the registry's metrics, per operation and size class; one thread
/// at a time (the group's running operation), so it takes no lock.
class op_metrics {
 public:
  /// Records a collective `op` (a literal: "allreduce", ...) of `bytes` bytes (SIZE_MAX:
  /// not given, size class "unknown") that succeeded in `took`.
  void record(std::string_view op, std::size_t bytes, std::chrono::nanoseconds took);

 private:
  struct entry {
    metrics::histogram* seconds = nullptr;
    metrics::counter* bytes = nullptr;
    metrics::counter* calls = nullptr;
  };
  std::map<std::pair<std::string_view, std::string_view>, entry> entries_;
  // The entry of the last call, found again by the literals' addresses: a group mostly
  // runs one operation at one size, and the map's string compares were a few percent of
  // a 4 KiB operation.
  const char* last_op_ = nullptr;
  const char* last_size_ = nullptr;
  entry* last_ = nullptr;
};

}  // namespace troupe::collectives::gloo_metrics
