#include <troupe/core/span_clock.hpp>

#include <fstream>
#include <string>

namespace troupe::span_clock {

namespace {

std::uint64_t ns_of(clock::time_point t) noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

// Which counter ticks() reads, and nanoseconds per tick.
struct counter {
  bool tsc = false;
  double ns_per_tick = 1.0;
};

#if defined(__x86_64__)
// The kernel keeps time with the TSC only after checking that it runs at a constant rate
// and is synchronized across CPUs; a VM's guest kernel says so too.
bool kernel_uses_tsc() {
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return f && (f >> name) && name == "tsc";
}
#endif

counter measure() {
  counter c;
#if defined(__x86_64__)
  if (!kernel_uses_tsc()) return c;
  const auto spin = std::chrono::milliseconds(2);
  const auto t0 = clock::now();
  const std::uint64_t c0 = __builtin_ia32_rdtsc();
  auto t1 = t0;
  // Bounded: the steady clock advances; 2 ms of spinning, once per process.
  while (t1 - t0 < spin) t1 = clock::now();
  const std::uint64_t c1 = __builtin_ia32_rdtsc();
  if (c1 <= c0) return c;
  c.tsc = true;
  c.ns_per_tick =
      std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(c1 - c0);
#endif
  return c;
}

const counter& the_counter() {
  static const counter c = measure();
  return c;
}

}  // namespace

std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
  if (the_counter().tsc) return __builtin_ia32_rdtsc();
#endif
  return ns_of(clock::now());
}

std::chrono::nanoseconds between(std::uint64_t from, std::uint64_t to) noexcept {
  if (to <= from) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(
      static_cast<std::int64_t>(static_cast<double>(to - from) * the_counter().ns_per_tick));
}

void calibrate() noexcept { (void)the_counter(); }

stamper::stamp stamper::now() noexcept {
  const auto& c = the_counter();
  if (!c.tsc) {  // ticks() is the steady clock in ns: one read makes both
    const auto at = clock::now();
    return {at, ns_of(at)};
  }
  const std::uint64_t t = ticks();
  if (rebase_ticks_ == 0 || t - base_ticks_ >= rebase_ticks_ || t < base_ticks_) {
    // The clock read after the counter: points counted from here are, if anything, late.
    base_ticks_ = t;
    base_at_ = clock::now();
    if (rebase_ticks_ == 0)
      rebase_ticks_ = static_cast<std::uint64_t>(
          std::chrono::duration<double, std::nano>(rebase).count() / c.ns_per_tick);
    return {base_at_, base_ticks_};
  }
  return {base_at_ + std::chrono::duration_cast<clock::duration>(between(base_ticks_, t) + margin),
          t};
}

}  // namespace troupe::span_clock
