// The metrics a gloo group keeps (docs/metrics.md): its queue depth, and the time, bytes
// and count of the collectives that succeeded. Internal to collectives/gloo.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>

#include <troupe/core/metrics.hpp>
#include <troupe/core/time.hpp>

namespace troupe::collectives::gloo_metrics {

/// Collectives queued on gloo groups, not yet started (one gauge for the process).
metrics::gauge& queue_depth();

/// One group's cache of the registry's metrics, per operation and size class; one thread
/// at a time (the group's running operation, or its worker between operations), so it
/// takes no lock. The figures are added up here and reach the registry in batches: every
/// flush_calls collectives of an entry, once flush_period has passed since its last
/// batch, and at flush() (the group's worker calls it before it parks and when it stops).
/// Four atomic additions per operation were about a tenth of a 4 KiB collective on one
/// member; metrics are exported every second, so a batch is never the one missed.
class op_metrics {
 public:
  static constexpr std::uint32_t flush_calls = 64;
  static constexpr std::chrono::milliseconds flush_period{10};

  /// Records a collective `op` (a literal: "allreduce", ...) of `bytes` bytes (SIZE_MAX:
  /// not given, size class "unknown") that succeeded in `took`; `now` (the operation's
  /// start will do: within milliseconds) paces the batches.
  void record(std::string_view op, std::size_t bytes, std::chrono::nanoseconds took,
              clock::time_point now);
  /// Hands every figure not yet in the registry over to it.
  void flush();

 private:
  struct entry {
    metrics::histogram* seconds = nullptr;
    metrics::counter* bytes = nullptr;
    metrics::counter* calls = nullptr;
    // Not yet in the registry: per bucket of `seconds`, their sum, the bytes.
    std::array<std::uint64_t, metrics::histogram::max_buckets + 1> counts{};
    double sum = 0;
    std::uint64_t unsent_bytes = 0;
    std::uint32_t unsent = 0;
    clock::time_point sent_at{};
    void send();
  };
  std::map<std::pair<std::string_view, std::string_view>, entry> entries_;
  // The entry of the last call, found again by the literals' addresses: a group mostly
  // runs one operation at one size, and the map's string compares were a few percent of
  // a 4 KiB operation.
  const char* last_op_ = nullptr;
  const char* last_size_ = nullptr;
  entry* last_ = nullptr;
  std::uint32_t pending_ = 0;  // entries with figures not yet sent
};

}  // namespace troupe::collectives::gloo_metrics
