#include <troupe/collectives/gloo/group_metrics.hpp>

#include <cstdint>
#include <string>

namespace troupe::collectives::gloo_metrics {

metrics::gauge& queue_depth() {
  static metrics::gauge& g = metrics::get_gauge(
      "troupe_collective_queue_depth", "collectives queued on gloo groups, not yet started");
  return g;
}

// The metrics of each (operation, size class) pair are looked up once per group and kept.
void op_metrics::record(std::string_view op, std::size_t bytes, std::chrono::nanoseconds took,
                        clock::time_point now) {
  const std::string_view size = bytes == SIZE_MAX ? "unknown" : metrics::size_class(bytes);
  if (!last_ || op.data() != last_op_ || size.data() != last_size_) {
    auto [it, fresh] = entries_.try_emplace({op, size});
    entry& m = it->second;
    if (fresh) {
      const metrics::labels op_size{{"op", std::string(op)}, {"size", std::string(size)}};
      const metrics::labels op_only{{"op", std::string(op)}};
      m.seconds = &metrics::get_histogram("troupe_collective_seconds",
                                          "time a gloo collective took on this worker, by "
                                          "operation and size class",
                                          metrics::latency_buckets(), op_size);
      m.bytes = &metrics::get_counter("troupe_collective_bytes_total",
                                      "tensor bytes of this worker's gloo collectives", op_only);
      m.calls = &metrics::get_counter("troupe_collective_calls_total",
                                      "gloo collectives this worker completed", op_only);
    }
    last_op_ = op.data();
    last_size_ = size.data();
    last_ = &m;
  }
  entry& m = *last_;
  const double seconds = std::chrono::duration<double>(took).count();
  ++m.counts[m.seconds->bucket_of(seconds)];
  m.sum += seconds;
  if (bytes != SIZE_MAX) m.unsent_bytes += bytes;
  if (m.unsent++ == 0) ++pending_;
  if (m.unsent >= flush_calls || now - m.sent_at >= flush_period) {
    m.send();
    m.sent_at = now;
    --pending_;
  }
}

void op_metrics::entry::send() {
  seconds->add(std::span<const std::uint64_t>(counts.data(), seconds->bounds().size() + 1), sum);
  calls->add(unsent);
  if (unsent_bytes != 0) bytes->add(unsent_bytes);
  counts.fill(0);
  sum = 0;
  unsent_bytes = 0;
  unsent = 0;
}

void op_metrics::flush() {
  if (pending_ == 0) return;
  const auto now = clock::now();
  for (auto& [key, m] : entries_)
    if (m.unsent != 0) {
      m.send();
      m.sent_at = now;
    }
  pending_ = 0;
}

}  // namespace troupe::collectives::gloo_metrics
