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
// Whether the time-stamp counter may time spans: where the kernel keeps time with it
// itself (it checked that it runs at a constant rate, synchronized across CPUs), or where
// it keeps time with KVM's paravirtual clock on a CPU whose counter is invariant
// ("constant_tsc" and "nonstop_tsc": one rate in every power state). That clock is the
// same counter scaled by the host, which starts the vCPUs' counters in step; reading it
// directly spares the scaling and its retry loop (26 ns a read against 10 on a 2-vCPU KVM
// guest). A counter read on another vCPU that went back makes the stamper read the clock
// again, and its margin covers one that lags by microseconds. Other clocks (hpet, xen,
// Hyper-V's) keep clock::now().
bool counter_keeps_time() {
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  if (!f || !(f >> name)) return false;
  if (name == "tsc") return true;
  if (name != "kvm-clock") return false;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  // Bounded: the first "flags" line (one per CPU; they agree).
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const std::string padded = line + " ";
    return padded.find(" constant_tsc ") != std::string::npos &&
           padded.find(" nonstop_tsc ") != std::string::npos;
  }
  return false;
}
#endif

counter measure() {
  counter c;
#if defined(__x86_64__)
  if (!counter_keeps_time()) return c;
  const auto spin = std::chrono::milliseconds(2);
  const auto t0 = clock::now();
  const std::uint64_t c0 = __builtin_ia32_rdtsc();
  auto t1 = t0;
  // Bounded: the steady clock advances; 2 ms of spinning, once per process.
  while (t1 - t0 < spin) t1 = clock::now();
  const std::uint64_t c1 = __builtin_ia32_rdtsc();
  if (c1 <= c0) return c;
  const double ns_per_tick =
      std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(c1 - c0);
  // 100 MHz to 10 GHz: anything else is not a counter to trust (a preempted calibration
  // reads somewhat off; the stamper's rebase every millisecond bounds what that costs).
  if (ns_per_tick < 0.1 || ns_per_tick > 10.0) return c;
  c.tsc = true;
  c.ns_per_tick = ns_per_tick;
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
