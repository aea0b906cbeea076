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
void op_metrics::record(std::string_view op, std::size_t bytes, std::chrono::nanoseconds took) {
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
  last_->seconds->observe(took);
  last_->calls->add();
  if (bytes != SIZE_MAX) last_->bytes->add(bytes);
}

}  // namespace troupe::collectives::gloo_metrics
