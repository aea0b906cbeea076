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

#if defined(__x86_64__)
// The counter and the clock read at one moment: the clock read between two reads of the
// counter, the narrowest of several such brackets kept. A bracket that an interrupt, a
// preemption or a stolen vCPU split is microseconds wide; the narrowest of 64 in a row
// (about 3 us here) is tens of nanoseconds wide, wherever the others fell.
struct reading {
  std::uint64_t ticks = 0;  // the middle of the bracket
  clock::time_point at{};
  std::uint64_t width = ~std::uint64_t{0};  // ticks between the bracket's two reads
};

reading read_together() {
  reading best;
  // Bounded: 64 brackets.
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t before = __builtin_ia32_rdtsc();
    const auto at = clock::now();
    const std::uint64_t after = __builtin_ia32_rdtsc();
    if (after < before || after - before >= best.width) continue;
    best = {before + (after - before) / 2, at, after - before};
  }
  return best;
}
#endif

counter measure() {
  counter c;
#if defined(__x86_64__)
  if (!counter_keeps_time()) return c;
  const auto spin = std::chrono::milliseconds(2);
  // Bounded: 3 tries. The rate comes from two bracketed readings 2 ms apart, so what
  // happens between them (preemption included) does not matter, only how wide the two
  // brackets are: each end is off by half its bracket at most. A try whose brackets add
  // up to more than 1/2000 of the span (1 us; 0.5 us in each 1 ms rebase, which the
  // stamper's margin covers) is taken again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const reading r0 = read_together();
    auto t = r0.at;
    // Bounded: the steady clock advances; 2 ms of spinning.
    while (t - r0.at < spin) t = clock::now();
    const reading r1 = read_together();
    if (r0.width == ~std::uint64_t{0} || r1.width == ~std::uint64_t{0} || r1.ticks <= r0.ticks)
      continue;
    const double span_ns = std::chrono::duration<double, std::nano>(r1.at - r0.at).count();
    const double ticks = static_cast<double>(r1.ticks - r0.ticks);
    const double ns_per_tick = span_ns / ticks;
    // 100 MHz to 10 GHz: anything else is not a counter to trust.
    if (ns_per_tick < 0.1 || ns_per_tick > 10.0) return c;
    if (static_cast<double>(r0.width + r1.width) > ticks / 2000.0) continue;
    c.tsc = true;
    c.ns_per_tick = ns_per_tick;
    return c;
  }
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
    if (rebase_ticks_ == 0) {
      rebase_ticks_ = static_cast<std::uint64_t>(
          std::chrono::duration<double, std::nano>(rebase).count() / c.ns_per_tick);
      bracket_ticks_ = static_cast<std::uint64_t>(
          std::chrono::duration<double, std::nano>(bracket).count() / c.ns_per_tick);
    }
    // The clock read between two reads of the counter, and paired with the first: points
    // counted from here are, if anything, late by the bracket. A bracket wider than
    // `bracket` (the thread was preempted or its vCPU stolen between the reads) would
    // make the next millisecond's points that much late: the clock's reading is the
    // stamp, and the next call tries again.
    const auto at = clock::now();
    const std::uint64_t after = ticks();
    if (after < t || after - t > bracket_ticks_) return {at, after};
    base_ticks_ = t;
    base_at_ = at;
    return {base_at_, base_ticks_};
  }
  return {base_at_ + std::chrono::duration_cast<clock::duration>(between(base_ticks_, t) + margin),
          t};
}

}  // namespace troupe::span_clock
