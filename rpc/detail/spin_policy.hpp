// spin_policy: whether a thread about to sleep until something arrives should first spin,
// and for how long. Sleeping costs a wake-up (a futex and a context switch, several
// microseconds each way on a busy machine), which dominates a short call's round trip;
// spinning costs CPU while it waits. The policy spins only while the recent waits were
// short: it keeps a moving average of the waits recorded, and grants the budget while that
// average is at most four budgets. A run of long waits (slow functions, idle connections)
// turns spinning off by itself; short ones turn it on again.
//
// Why four budgets and not one: the waits recorded while nobody spins include the wake-ups
// that spinning saves, on both ends of a call. Two peers whose round trip is 30 us while
// they spin may measure 100 us while they sleep; a threshold below that would keep both
// from ever spinning again once a burst of noise had turned them off.
// Thread-safe: record() and grant() may be called from any thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace troupe::rpc::detail {

class spin_policy {
 public:
  /// `budget` zero: never spin.
  explicit spin_policy(std::chrono::microseconds budget) noexcept
      : budget_ns_(budget.count() * 1000) {}

  /// How long the next wait may spin before it sleeps: the budget, or zero.
  std::chrono::nanoseconds grant() const noexcept {
    if (budget_ns_ <= 0) return std::chrono::nanoseconds(0);
    const auto typical = typical_ns_.load(std::memory_order_relaxed);
    return std::chrono::nanoseconds(typical <= 4 * budget_ns_ ? budget_ns_ : 0);
  }

  /// One wait's length (from when it could have started spinning until what it waited for
  /// was there, whether it spun or slept). Waits are weighed 1/8 against the average.
  void record(std::chrono::nanoseconds waited) noexcept {
    if (budget_ns_ <= 0) return;
    // Long waits count as eight budgets: one wait of a second must not keep spinning off
    // for the hundreds of short waits after it.
    const std::int64_t w = std::min<std::int64_t>(waited.count(), 8 * budget_ns_);
    const auto old = typical_ns_.load(std::memory_order_relaxed);
    typical_ns_.store(old + (w - old) / 8, std::memory_order_relaxed);  // a lost update is harmless
  }

  /// Spins for up to `grant`, yielding the core between checks (the thread that makes
  /// `ready` true may need it), until `ready()` holds. Returns whether it does.
  template <class Ready>
  static bool spin_until(std::chrono::nanoseconds grant, Ready&& ready) {
    const auto until = std::chrono::steady_clock::now() + grant;
    while (!ready()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::yield();
    }
    return true;
  }

 private:
  const std::int64_t budget_ns_;
  std::atomic<std::int64_t> typical_ns_{0};  // starts short: the first waits spin
};

}  // namespace troupe::rpc::detail
