// Cheap time for the hot path of a small operation: a deadline's start and the span the
// operation took, where each read of clock::now() (26 ns on the 2-vCPU benchmark VM, the
// time-stamp counter 10 ns) was a tenth of a 4 KiB collective's bookkeeping in a group of
// one. (The kernel's coarse clock, read in 6 ns, lagged the fine one by 2.5 to 6.5 ms
// there, more than its 4 ms tick: no start for a deadline.)
#pragma once

#include <chrono>
#include <cstdint>

#include <troupe/core/time.hpp>

namespace troupe::span_clock {

/// A reading of a counter for timing spans: the CPU's time-stamp counter where the kernel
/// keeps time with it (x86-64 whose clocksource is "tsc": constant rate, synchronized
/// across CPUs; about 10 ns a read) or with KVM's clock on an invariant counter
/// ("kvm-clock", and "constant_tsc" and "nonstop_tsc" among the CPU's flags), else
/// clock::now() in nanoseconds. Only differences of two readings mean anything (between()).
std::uint64_t ticks() noexcept;

/// The span from reading `from` to reading `to` (0 when `to` is not after `from`).
std::chrono::nanoseconds between(std::uint64_t from, std::uint64_t to) noexcept;

/// Finds which counter ticks() reads and measures its rate against clock::now() (a spin
/// of about 2 ms, once per process), unless already done. Call it where 2 ms do not
/// matter (a group's start): ticks() and between() otherwise do it on first use.
void calibrate() noexcept;

/// Time points of clock::now()'s clock taken from the span counter: clock::now() is read
/// only when `rebase` of counted time passed since it was last, and otherwise the counted
/// time since then is added to that reading. The counter's rate was measured against the
/// same clock, and even a clock slewed by 500 ppm drifts 0.5 us from it in 1 ms: each
/// point is made `margin` later, so that a deadline taken from it is never early (and
/// late by microseconds). Not thread-safe: one per thread of use, or per user of one
/// thread at a time (a group's runner, which runs one operation at a time).
class stamper {
 public:
  /// Counted time after which clock::now() is read again.
  static constexpr std::chrono::milliseconds rebase{1};
  /// How much later than the extrapolated time each point is made.
  static constexpr std::chrono::microseconds margin{5};
  /// The widest pair of counter reads around a read of clock::now() that a rebase
  /// accepts.
  static constexpr std::chrono::microseconds bracket{1};

  /// A point in time and the counter's reading then.
  struct stamp {
    /// Not before the present, and at most about `margin` after it.
    clock::time_point at;
    /// ticks() at that moment, for between().
    std::uint64_t ticks;
  };
  /// The present as a stamp: one read of the counter, and of clock::now() once per
  /// `rebase` (and where the counter is the steady clock itself).
  stamp now() noexcept;

 private:
  clock::time_point base_at_{};
  std::uint64_t base_ticks_ = 0;
  std::uint64_t rebase_ticks_ = 0;   // `rebase` in ticks; 0 until the first reading
  std::uint64_t bracket_ticks_ = 0;  // `bracket` in ticks
};

}  // namespace troupe::span_clock
