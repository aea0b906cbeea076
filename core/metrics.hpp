// Process-wide metrics: counters, gauges and histograms with fixed buckets, kept in one
// registry. Hot paths pay one or two relaxed atomic additions per event: a site looks its
// metric up once (a function-local static reference) and updates it lock-free after that.
//
//   static auto& calls = metrics::get_counter("troupe_rpc_client_calls_total", "RPC calls");
//   calls.add();
//
// A snapshot of the registry encodes to a compact line format (encode_snapshot) that
// troupe-run reads back (decode_snapshot) and renders in Prometheus' text exposition
// format (prometheus_text). Workers export their snapshot to the file TROUPE_METRICS_FILE
// names (start_export_from_env); docs/metrics.md lists every metric.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe::metrics {

/// Label name and value pairs, e.g. {{"op", "allreduce"}, {"size", "64KiB"}}. Names are
/// Prometheus label names; values must not contain spaces, commas, '=' or newlines.
using labels = std::vector<std::pair<std::string, std::string>>;

/// A value that only grows. Thread-safe, lock-free.
class counter {
 public:
  /// Adds `n` (relaxed).
  void add(std::uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  /// The current value.
  std::uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

/// A value that goes up and down (a queue's depth). Thread-safe, lock-free.
class gauge {
 public:
  /// Adds `n`, which may be negative (relaxed).
  void add(std::int64_t n) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  /// Replaces the value.
  void set(std::int64_t v) noexcept { value_.store(v, std::memory_order_relaxed); }
  /// The current value.
  std::int64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> value_{0};
};

/// Observations counted into fixed buckets (upper bounds, ascending, +Inf implied), with
/// their sum and count. Thread-safe, lock-free; a snapshot taken while observations land
/// may be off by the ones in flight.
class histogram {
 public:
  /// Bounds beyond this many are dropped; bounds must be strictly ascending.
  static constexpr std::size_t max_buckets = 24;
  /// A histogram with these upper bounds (the first max_buckets are kept).
  explicit histogram(std::span<const double> bounds);

  /// Counts `v` into bucket_of(v) (relaxed).
  void observe(double v) noexcept;
  /// The first bucket whose bound is >= v; bounds().size() (+Inf) when none is.
  std::size_t bucket_of(double v) const noexcept;
  /// Adds observations counted elsewhere: `counts` per bucket (bounds().size() + 1 of
  /// them, the last for +Inf; fewer are taken as zeros) and the sum of their values.
  void add(std::span<const std::uint64_t> counts, double sum) noexcept;
  /// Records a duration, in seconds.
  template <class Rep, class Period>
  void observe(std::chrono::duration<Rep, Period> d) noexcept {
    observe(std::chrono::duration<double>(d).count());
  }

  /// The buckets' upper bounds, as given (without +Inf).
  std::span<const double> bounds() const noexcept { return {bounds_.data(), size_}; }
  /// Non-cumulative count of bucket `i` (i == bounds().size() is the +Inf bucket).
  std::uint64_t bucket(std::size_t i) const noexcept {
    return counts_[i].load(std::memory_order_relaxed);
  }
  /// The sum of every observed value.
  double sum() const noexcept { return sum_.load(std::memory_order_relaxed); }

 private:
  std::size_t size_ = 0;
  std::array<double, max_buckets> bounds_{};
  std::array<std::atomic<std::uint64_t>, max_buckets + 1> counts_{};
  std::atomic<double> sum_{0};
};

/// Latency buckets in seconds: 10 µs to 10 s.
std::span<const double> latency_buckets() noexcept;

/// The size class of a message or tensor of `bytes` bytes, as a label value: the smallest
/// of "1KiB", "16KiB", "256KiB", "4MiB", "64MiB" that holds it, else "large".
std::string_view size_class(std::size_t bytes) noexcept;

/// The metric `name` with `label_set`, created on first use with `help` (one line). The
/// reference stays valid for the life of the process. Thread-safe; takes the registry's
/// mutex, so cache the reference on hot paths. Asking for an existing name as another
/// type is a programming error (the process aborts with a message).
counter& get_counter(std::string_view name, std::string_view help, const labels& label_set = {});
gauge& get_gauge(std::string_view name, std::string_view help, const labels& label_set = {});
histogram& get_histogram(std::string_view name, std::string_view help,
                         std::span<const double> bounds, const labels& label_set = {});

/// What a metric is, as Prometheus' TYPE line names it.
enum class kind {
  /// Only grows (a name ending in _total).
  counter,
  /// Goes up and down.
  gauge,
  /// Bucketed observations with their sum and count.
  histogram,
};

/// One metric as read at one moment.
struct sample {
  /// The metric's name, e.g. "troupe_rpc_client_calls_total".
  std::string name;
  /// One line saying what it counts.
  std::string help;
  /// Counter, gauge or histogram.
  metrics::kind kind = kind::counter;
  /// Its labels, in the order given at registration.
  metrics::labels label_set;
  /// The value of a counter or gauge.
  double value = 0;
  /// A histogram's bucket bounds (without +Inf).
  std::vector<double> bounds;
  /// A histogram's cumulative counts: one per bound, then the +Inf bucket (the count).
  std::vector<std::uint64_t> cumulative;
  /// A histogram's sum of observations.
  double sum = 0;
};

/// Every registered metric, sorted by name then labels.
std::vector<sample> snapshot();

/// The compact line format of `samples` ("troupe-metrics 1" then one line per metric).
std::string encode_snapshot(std::span<const sample> samples);
/// Reads what encode_snapshot wrote; errc::protocol_error naming the bad line otherwise.
expected<std::vector<sample>> decode_snapshot(std::string_view text);

/// Prometheus' text exposition format (version 0.0.4) of `samples`: for each name one
/// HELP and one TYPE line, then its samples (histograms as _bucket{le=...}, _sum, _count).
/// Samples of one name may come from several sources (distinguished by their labels).
std::string prometheus_text(std::vector<sample> samples);

/// Writes snapshots to `path` every `interval` from a background thread, and once more at
/// normal exit (atexit). Each write replaces the file atomically (write, then rename). Only
/// the first call in a process starts anything; later ones return at once.
void start_export(const std::string& path, duration interval = std::chrono::seconds(1));
/// start_export to TROUPE_METRICS_FILE when it is set (troupe-run sets it for its workers
/// when it serves metrics); nothing otherwise. Cheap to call more than once.
void start_export_from_env();

}  // namespace troupe::metrics
