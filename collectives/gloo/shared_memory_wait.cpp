// The waits of a gloo group's shared-memory segment (shared_memory.hpp): how a member
// publishes its progress and waits for the others', spinning, yielding or sleeping on the
// segment's futex word, and how a wait learns that a member failed, exited, disagreed or
// missed the deadline. The collectives that use them are in shared_memory.cpp.
#include <troupe/collectives/gloo/shared_memory.hpp>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/collectives/gloo/shm_names.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// How a waiter waits: when the members can all run at once it spins for spin_time
// (a reply within microseconds is seen at once: world 2, 4-16 KiB, 0.56-0.87x the time of
// yielding only); then, until yield_time from the start, it yields its CPU between polls;
// then it sleeps on the futex. A member it waits for may be runnable on the same CPU
// (more members than CPUs, or other threads busy): a yield hands the CPU over at once,
// where a futex sleep and wake-up cost tens of microseconds (4 members on 2 CPUs: a 4 KiB
// allreduce 43 -> 11 us). With a CPU to itself, a yield returns at once and the poll goes
// on. bench/RESULTS.md has the trials.
constexpr auto spin_time = std::chrono::microseconds(5);
constexpr auto yield_time = std::chrono::microseconds(100);
// How often a sleeping waiter wakes to check that the members it waits for are alive.
constexpr auto liveness_period = std::chrono::milliseconds(20);

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, ts, nullptr, 0);
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

// Where this member runs, for the others' waits (see wait()): a store only when it moved.
void segment::note_cpu() noexcept {
  const int c = ::sched_getcpu();
  const auto v = c < 0 ? 0u : static_cast<std::uint32_t>(c) + 1;
  if (v != cpu_) {
    cpu_ = v;
    at(rank_).cpu.store(v, std::memory_order_relaxed);
  }
}

// Whether a member this one waits for last began an operation on this member's CPU.
bool segment::shares_cpu_with_waited() noexcept {
  note_cpu();
  if (cpu_ == 0) return false;
  for (int r : waiting_)
    if (at(r).cpu.load(std::memory_order_relaxed) == cpu_) return true;
  return false;
}

void segment::wake_all() noexcept {
  auto& h = head();
  h.wake.fetch_add(1);
  futex(&h.wake, FUTEX_WAKE, INT32_MAX, nullptr);
}

void segment::mark_failed() noexcept {
  if (!map_) return;
  std::int32_t none = 0;
  head().failed_by.compare_exchange_strong(none, rank_ + 1);
  wake_all();
}

void segment::abort() noexcept {
  aborted_.store(true);
  if (map_) wake_all();
}

// A publish is a plain store: the line it writes is one the others poll, so the store
// waits for their copies to be taken back, and as a sequentially consistent store (an
// exchange) it held this member up for that, a fifth of a 4 KiB allgather at world 2. The
// check for sleepers that must follow it (settle()) comes at this member's next wait, after
// the work it does meanwhile (its own block's copy) and usually after the store is done.
void segment::publish() noexcept {
  at(rank_).phase.store(++phase_, std::memory_order_release);
  wake_due_ = true;
}

// The sleeper's side in wait() counts itself, then looks at the phases once more; this side
// stored its phase, and the fence orders that store before its look at the count: either a
// sleeper sees the phase or this sees the sleeper, and wakes it. Nobody sleeping (the usual
// case), the futex word is left alone: no line that every member writes on every step.
// Every wait settles before it returns or sleeps, and every operation waits after its last
// publish, so no publish of an operation that returned is left unsettled.
void segment::settle() noexcept {
  if (!wake_due_) return;
  wake_due_ = false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto& h = head();
  if (h.sleepers.load() != 0) {
    h.wake.fetch_add(1);
    futex(&h.wake, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

bool segment::alive(int r) const {
  if (!check_liveness_) return true;
  auto& m = at(r);
  auto ps = read_proc(static_cast<int>(m.pid.load()));
  return ps && ps->running && ps->start == m.start.load();
}

template <class Missing>
bool segment::wait(Missing&& missing, clock::time_point deadline, const char* step) {
  auto& h = head();
  // Compares with member r if it started this collective: whether or not it got as far
  // as this member waits for.
  auto compare_if_started = [&](int r) {
    const auto d = read_desc(r);
    if (d.seq == seq_ && d.kind != 0) return check_agreement(r);
    return true;
  };
  auto check_abandoned = [&] {
    if (aborted_.load()) return fail(make_error(errc::aborted, "the group is shutting down"));
    if (auto by = h.failed_by.load(); by != 0 && by != rank_ + 1) {
      // When it failed on finding that the members disagree, say on what.
      if (!compare_if_started(by - 1)) return false;
      return fail(make_error(errc::connection_lost, "rank ", world(by - 1),
                             " failed an operation of the group first"));
    }
    return true;
  };
  auto& waiting = waiting_;
  auto done = [&] {
    waiting.clear();
    missing(waiting);
    return waiting.empty();
  };
  // Whatever the wait ends in, this member's publishes are settled first (see settle()):
  // after the spin, when the store is long done and the fence costs little.
  struct settled {
    segment& s;
    ~settled() { s.settle(); }
  } at_exit{*this};
  if (done()) return true;
  const auto start = clock::now();
  // Members that can all run at once but share a CPU now (the scheduler placed them so)
  // would take turns on it through the yields below, 15 us at a time, and a yielding task
  // is never moved to another CPU (it always looks cache-hot): they sleep instead, and the
  // wake-up puts the sleeper on an idle CPU. World 2 on 2 cores, 64 KiB allgathers: every
  // other one took 26 us instead of 2 in runs where both members had landed on one CPU.
  const bool together = run_at_once_ && shares_cpu_with_waited();
  if (run_at_once_ && !together) {
    do {
      for (int i = 0; i < 16; ++i) {
        cpu_relax();
        if (done()) return true;
      }
    } while (clock::now() - start < spin_time);
  }
  settle();  // before a wait that may hand the CPU over or sleep
  if (!together) {
    do {
      ::sched_yield();
      if (done()) return true;
    } while (clock::now() - start < yield_time);
  }
  auto next_liveness = clock::now() + liveness_period;
  for (;;) {
    const std::uint32_t seen = h.wake.load();
    if (done()) return true;
    // A member that started this collective with other arguments may never get where this
    // one waits for it (two members each taking the other for the root), or failed on
    // seeing the difference: compare with it now instead of waiting for the deadline.
    for (int r : waiting)
      if (!compare_if_started(r)) return false;
    if (!check_abandoned()) return false;
    const auto now = clock::now();
    if (now >= next_liveness) {
      for (int r : waiting)
        if (!alive(r))
          return fail(make_error(errc::connection_lost, "rank ", world(r), " (pid ",
                                 at(r).pid.load(), ") exited during ", what(), " (collective #",
                                 seq_, ")"));
      next_liveness = now + liveness_period;
    }
    if (now >= deadline) {
      std::vector<int> ranks;
      for (int r : waiting) ranks.push_back(world(r));
      return fail(make_error(errc::timeout, what(), " (collective #", seq_,
                             "): ", ranks.size() == 1 ? "rank " : "ranks ", format_ranks(ranks),
                             " ", step, " in time"));
    }
    auto nap = std::min<clock::duration>(deadline - now, next_liveness - now);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    h.sleepers.fetch_add(1);
    // Checked again after counting itself (see publish()).
    if (h.wake.load() == seen && !done()) futex(&h.wake, FUTEX_WAIT, seen, &ts);
    h.sleepers.fetch_sub(1);
  }
}

bool segment::wait_all(std::uint64_t target, clock::time_point deadline, const char* step,
                       bool agree) {
  if (!wait(
          [&](std::vector<int>& out) {
            for (int r = 0; r < size_; ++r)
              if (r != rank_ && at(r).phase.load() < target) out.push_back(r);
          },
          deadline, step))
    return false;
  if (agree && !agreed_) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !check_agreement(r)) return false;
    agreed_ = true;
  }
  return true;
}

bool segment::wait_one(int r, std::uint64_t target, clock::time_point deadline, const char* step) {
  if (!wait(
          [&](std::vector<int>& out) {
            if (at(r).phase.load() < target) out.push_back(r);
          },
          deadline, step))
    return false;
  if (!agreed_) {
    if (!check_agreement(r)) return false;
    agreed_ = true;
  }
  return true;
}

}  // namespace troupe::collectives::gloo_shm
