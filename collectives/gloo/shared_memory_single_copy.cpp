// The single-copy allgather of a gloo group's shared-memory segment (shared_memory.hpp,
// segment::allgather): each member takes the others' blocks from their own memory, through
// the pipes they spliced them into (shared_memory_pipes.cpp) or, without pipes, with
// process_vm_readv, instead of through the slots. Whether the members may read one another
// is found in open() (shared_memory_open.cpp); the slots and their invariants are in
// shared_memory.cpp, which runs the allgather when this declines.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/collectives/shared_host_memory.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// Allgathers of single_copy_min_bytes to single_copy_max_bytes per member, when the members
// can all run at once and read one another's memory, may read the others' blocks where
// they lie: one copy of each block instead of two through a slot, for a publish more
// (every member must have read a member's input before it returns). World 2 on 2 cores, 9
// alternating runs of process_vm_readv against the slots (bench/RESULTS.md; the pipes
// took 0.76-0.84x the time of process_vm_readv at 32 KiB, 0.77-0.97x at 128 KiB):
// - unchanged inputs, in both CPUs' caches: 16 KiB per member 1.42x the time, 32 KiB
//   0.93x, 64 KiB 0.79x, 128 KiB 0.70x, 160 KiB 0.78x, 192 KiB 0.93x, 256 KiB 1.24x (the
//   kernel pins the pages, which costs more than its copy; two user copies through the
//   caches win again above);
// - inputs rewritten just before: 32 KiB 1.26x, 64 KiB 1.08x, 128 KiB 1.14x (the lines
//   are dirty in the writer's cache; not the publish more, whose wait costs nothing here);
// - inputs evicted from the caches before: 32 KiB 1.41-1.48x, 64 KiB 1.01-1.16x,
//   128 KiB 0.81-1.27x.
// A later day, same machine, 9 runs of 300 allgathers with inputs rewritten before each:
// 32 KiB per member 0.99x, 128 KiB 0.89x. Neither way wins for every caller and every
// machine state: a training step hands over inputs just written (gradients) or long
// evicted, a job that gathers frozen weights again and again has them in the caches.
// So by default the members measure (single_copy_mode::measured), with one choice per
// size class, the slots at first:
// - Each cycle of allgathers of the class runs its last explore_ops the other way. The
//   exploring allgathers come in a run because one read alone finds the others' inputs
//   out of its caches.
// - A member times the last `samples` allgathers of each way (of the run), each alone
//   and from its start to the next allgather's of the class. Alone, reading looks better
//   than it is: it leaves copies of the others' inputs in the reader's caches, which
//   their owners must take back when they write their next input, outside the allgather.
//   From start to start, the caller's work in between adds its noise: with 48 MiB
//   written before each allgather (collectives_bench --cold) the two ways' periods
//   differed by chance by up to 6%.
// - At the next cycle's first allgather (the exchange) every member publishes its best
//   times with its input's address; all sum every member's figures alike and decide by
//   reads_next(): reading takes over when faster by both measures.
// - Cycles double from first_cycle to max_cycle: exploring the slower way costs 4 in 1024
//   allgathers later on. The first exploration costs more than the others: the first
//   copies of a process's pages by another cost 170-410 us (bench/RESULTS.md, the twelfth
//   Open MPI entry), 4 reads 300-360 us more than 4 allgathers through the slots (about
//   10 us each at 128 KiB per member, world 2), which reading at its best (0.70x) wins
//   back over about 110 allgathers. A class that has run n allgathers is taken to run
//   about n more, so the first exploration waits for the class's 125th allgather (first
//   cycle 128): a job that runs a class 50 times keeps the slots for all of them (at 8,
//   the 50 allgathers of a benchmark at 128 KiB per member took 1.43x the time of 128, 9
//   alternating runs, on a VM where the slots stay faster). A cycle right after a switch
//   does not explore: its exchange compares the new way's figures with the old way's from
//   the cycle before, so that a switch is confirmed (or undone) without running the
//   slower way again (at 256 KiB and world 2 the explorations and the slots' first cycle
//   had taken the mean of 50 allgathers 1.09x above always reading).
// At 4 members on 2 cores (taking turns on a CPU) the publish more cost 1.1-2x the time
// at every size: never there.
constexpr std::size_t single_copy_min_bytes = 32 << 10;
constexpr std::size_t single_copy_max_bytes = 192 << 10;
constexpr std::uint32_t first_cycle = 128, max_cycle = 1024, explore_ops = 4, samples = 2;
constexpr std::uint32_t no_time = ~std::uint32_t{0};
// Nanoseconds from `a` to `b`, below no_time (about 4.3 s) at most.
std::uint32_t ns_between(clock::time_point a, clock::time_point b) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(ns, 0, no_time - 1));
}

}  // namespace

// The tuner of a size class: below 64 KiB per member, below 128 KiB, and above.
std::size_t segment::size_class(std::size_t bytes) noexcept {
  return bytes < (64 << 10) ? 0 : bytes < (128 << 10) ? 1 : 2;
}

bool segment::in_single_copy_range(std::size_t bytes) noexcept {
  return bytes >= single_copy_min_bytes && bytes <= single_copy_max_bytes;
}

// Every member that reads splices its input into its pipes (or says where it lies) and
// publishes; once all have, each reads the others' blocks into its output, publishes
// again, copies its own block meanwhile, and returns once all have read (its input must
// not change or go away before). At a tuner's exchange (and at the first allgather of
// these sizes, which learns from the members' flags whether all can read) every member
// publishes first and decides after, and with pipes splices and publishes once more when
// the decision is to read; when it is the slots, the caller copies through them (the
// publish here is then one more, which nothing waits for). Every member takes the same
// path: the window, run_at_once_ and use_pipes_ are the same everywhere, and so are
// single_copy_ once known and every tuner (see above).
segment::single_copy_outcome segment::allgather_single_copy(
    const std::byte* own, std::size_t bytes, const std::optional<shared_region>& own_region,
    std::byte* dst, clock::time_point deadline) {
  timing_ = nullptr;
  if (!run_at_once_ || !in_single_copy_range(bytes) || single_copy_ == 0)
    return single_copy_outcome::slots;
  auto& t = tuners_[size_class(bytes)];
  // The last sample's time to this allgather's start (its allgather's own time is taken
  // when it ends: note_sample()).
  clock::time_point now{};
  if (t.sampling >= 0) {
    now = clock::now();
    t.best[t.sampling].period =
        std::min(t.best[t.sampling].period, ns_between(t.sample_start, now));
    t.sampling = -1;
  }
  auto& line = at(rank_);
  say_source(own, own_region);
  // Reading takes the others' inputs through this member's mappings of their shared host
  // buffers instead of the pipes when the class's last allgather found every input in one
  // (single_copy_tuner::all_shared): one copy without a system call, where the pipes take
  // two. Every member knows it alike before its publish; a member whose input has left its
  // shared buffer since is read with process_vm_readv, which every member may then use
  // (learned first, as for broadcasts). The tuner still chooses between reading and the
  // slots: with inputs in shared buffers, world 2, 7 alternating runs, reading them took
  // 0.49x the time of the slots at 32 KiB per member and 0.33x at 128 KiB when unchanged
  // between allgathers, but 1.75x and 2.15x when rewritten just before (dirty in their
  // owner's caches).
  if (t.all_shared && all_read_ < 0 && !learn_readers(deadline)) return single_copy_outcome::failed;
  const bool pipes = use_pipes_ && !(t.all_shared && all_read_ == 1);
  // Known here except at an exchange, where it is decided after the publish.
  const bool exchange = single_copy_ < 0 || (single_copy_ == 2 && t.position == 0);
  bool read = true;
  if (exchange) {
    for (int way : {0, 1}) {
      line.timed[way].op.store(t.best[way].op, std::memory_order_relaxed);
      line.timed[way].period.store(t.best[way].period, std::memory_order_relaxed);
    }
  } else if (single_copy_ == 2) {
    const std::uint32_t p = t.position;
    const bool explore = !t.switched && p >= t.cycle - explore_ops;
    read = explore != t.read;
    if (explore ? p >= t.cycle - samples : p >= t.cycle - explore_ops - samples) {
      t.sampling = read ? 1 : 0;
      t.sample_start = now == clock::time_point{} ? clock::now() : now;
      timing_ = &t;
    }
    t.position = p + 1 == t.cycle ? 0 : p + 1;
  }
  if (!read) return single_copy_outcome::slots;
  // At an exchange the way is known only after the publish: the pipes get the block after
  // the decision, and one publish more says it is there.
  if (pipes && !exchange && !splice_own(own, bytes)) return single_copy_outcome::failed;
  publish();
  if (!wait_all(phase_, deadline, "did not contribute")) return single_copy_outcome::failed;
  t.all_shared = all_shared();
  if (exchange) {
    if (single_copy_ < 0) {
      single_copy_ = 1;
      for (int r = 0; r < size_; ++r) {
        const auto flag = at(r).single_copy.load(std::memory_order_relaxed) & 3u;
        if (flag == 2) {
          single_copy_ = 0;
          break;
        }
        if (flag == 3) single_copy_ = 2;
      }
    }
    if (single_copy_ == 0) close_pipes();
    if (single_copy_ == 2) retune(t);
    if (single_copy_ == 0 || (single_copy_ == 2 && !t.read)) return single_copy_outcome::slots;
    if (pipes) {
      if (!splice_own(own, bytes)) return single_copy_outcome::failed;
      publish();
      if (!wait_all(phase_, deadline, "did not contribute", false))
        return single_copy_outcome::failed;
    }
  }
  return read_members(own, bytes, dst, deadline, pipes) ? single_copy_outcome::read
                                                        : single_copy_outcome::failed;
}

bool reads_next(bool reading, const std::uint64_t (&op)[2], const std::uint64_t (&period)[2]) {
  if (!reading) return op[1] * 20 < op[0] * 19 && period[1] * 20 < period[0] * 19;
  return op[1] <= op[0] && period[1] <= period[0];
}

// Sums every member's figures for the cycle that ended (see above). Without all of them
// (the first exchange, before any cycle) the choice stays as it is: every member samples
// the same allgathers, so all have them or none.
void segment::retune(single_copy_tuner& t) {
  std::uint64_t op[2] = {0, 0}, period[2] = {0, 0};
  bool complete = true;
  for (int r = 0; r < size_; ++r)
    for (int way : {0, 1}) {
      const auto o = at(r).timed[way].op.load(std::memory_order_relaxed);
      const auto p = at(r).timed[way].period.load(std::memory_order_relaxed);
      complete = complete && o != no_time && p != no_time;
      op[way] += o;
      period[way] += p;
    }
  t.switched = t.cycle > 0 && complete && reads_next(t.read, op, period) != t.read;
  if (t.switched) {
    t.read = !t.read;
    TROUPE_LOG(log_level::debug, "collectives", "rank ", world(rank_), ": ", what(),
               !t.read                          ? " now copies through shared memory"
               : t.all_shared && all_read_ == 1 ? " now reads the others' shared inputs"
               : use_pipes_                     ? " now takes the others' blocks through pipes"
                                                : " now reads the others' memory",
               " (the members' best times summed, reading against the slots: ", op[1] / 1000,
               " against ", op[0] / 1000, " us alone, ", period[1] / 1000, " against ",
               period[0] / 1000, " us from start to start)");
  }
  t.cycle = t.cycle == 0 ? first_cycle : std::min(t.cycle * 2, max_cycle);
  t.position = 1;
  // After a switch the next cycle does not explore: the way left keeps its figures, just
  // taken, for the next exchange to compare with the new way's.
  t.best[t.read ? 1 : 0] = {};
  if (!t.switched) t.best[t.read ? 0 : 1] = {};
}

void segment::note_sample() noexcept {
  if (!timing_) return;
  auto& best = timing_->best[timing_->sampling].op;
  best = std::min(best, ns_between(timing_->sample_start, clock::now()));
  timing_ = nullptr;
}

std::size_t segment::pipe_bytes_wanted() {
  // The largest block on pages of its own, and two broadcast pieces (pipe_piece_bytes,
  // shared_memory_pipes.cpp): 64 pages, what the kernel makes of either (a power of two).
  static_assert(single_copy_max_bytes + shm_layout::page <= (256 << 10));
  return 256 << 10;
}

bool segment::read_memory(std::size_t bytes, std::byte* dst) {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !read_from(r, dst + bytes * static_cast<std::size_t>(r), bytes, 0))
      return false;
  return true;
}

bool segment::read_from(int r, std::byte* to, std::size_t bytes, std::size_t at_offset) {
  return cross_copy(r, to, bytes, at_offset, false);
}

// The region's fields lie on a line of their own, touched only for shared buffers: the
// flag in `source` (on the line the others read for the phase) says whether to look.
void segment::say_source(const std::byte* p, const std::optional<shared_region>& region) noexcept {
  auto& line = at(rank_);
  auto source = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  if (region) {
    line.region_fd.store(region->fd, std::memory_order_relaxed);
    line.region_id.store(region->id, std::memory_order_relaxed);
    line.region_base.store(region->base, std::memory_order_relaxed);
    line.region_bytes.store(region->bytes, std::memory_order_relaxed);
    source |= shm_layout::in_shared_region;
  }
  line.source.store(source, std::memory_order_relaxed);
}

bool segment::cross_copy(int r, std::byte* mine, std::size_t bytes, std::size_t at_offset,
                         bool write) {
  const auto& line = at(r);
  const auto pid = static_cast<pid_t>(line.pid.load(std::memory_order_relaxed));
  const auto source = line.source.load(std::memory_order_relaxed);
  const auto theirs =
      static_cast<std::uintptr_t>(source & ~shm_layout::in_shared_region) + at_offset;
  if ((source & shm_layout::in_shared_region) != 0) {
    const shared_region region{line.region_fd.load(std::memory_order_relaxed),
                               line.region_id.load(std::memory_order_relaxed),
                               line.region_base.load(std::memory_order_relaxed),
                               line.region_bytes.load(std::memory_order_relaxed)};
    if (auto* here = peers_.local(pid, region, theirs, bytes)) {
      if (write)
        std::memcpy(here, mine, bytes);
      else
        std::memcpy(mine, here, bytes);
      ++mapped_copies_;
      return true;
    }
  }
  for (std::size_t done = 0; done < bytes;) {
    iovec local{mine + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(theirs + done), bytes - done};
    const auto n = write ? ::process_vm_writev(pid, &local, 1, &remote, 1, 0)
                         : ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      mark_failed();
      if (e == ESRCH)
        return fail(make_error(errc::connection_lost, "rank ", world(r), " (pid ", pid,
                               ") exited during ", what(), " (collective #", seq_, ")"));
      return fail(make_error(errc::connection_lost, what(), " (collective #", seq_,
                             "): ", write ? "writing into rank " : "reading rank ", world(r),
                             write ? "'s memory failed (" : "'s data from its memory failed (",
                             std::strerror(e),
                             "); set TROUPE_GLOO_SHM_SINGLE_COPY=0 to copy through shared "
                             "memory instead"));
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool segment::learn_readers(clock::time_point deadline) {
  if (all_read_ >= 0) return true;
  // Every member wrote its flag before its first publish: once each has published, all
  // read the same flags.
  publish();
  if (!wait_all(phase_, deadline, "did not arrive")) return false;
  all_read_ = 1;
  for (int r = 0; r < size_; ++r)
    if ((at(r).single_copy.load(std::memory_order_relaxed) & shm_layout::reads_memory) == 0)
      all_read_ = 0;
  return true;
}

// Every member says where its tensor lies and publishes; once all have, each other member
// reads the head of the data from the root and the root writes the tail into each
// (process_vm_writev): the root and the others copy at once, for one publish and wait
// more. Each publishes once more, and the root's tensor stays as it is until broadcast()'s
// last wait, which every member passes only once all have their data. At world 2 on 2
// cores splitting took 0.77x the time of reading it all at 64 KiB (9 alternating runs);
// with 4 members on 2 cores (taking turns on a CPU), 0.84x at 4 MiB and 0.90x at 16 MiB,
// where below 4 MiB such members broadcast through the slots (segment::broadcast), unless
// every member's buffer of the last broadcast from 512 KiB was shared.
bool segment::broadcast_read(std::byte* data, std::size_t bytes, int root,
                             const std::optional<shared_region>& region,
                             clock::time_point deadline) {
  say_source(data, region);
  publish();
  if (!wait_all(phase_, deadline, "did not arrive")) return false;
  note_shared_broadcast(bytes);
  // The root's share: 1/n of the data into each of the n - 1 others, who read the rest:
  // each copies about as much. On page boundaries, so that no page is pinned twice.
  const std::size_t tail = std::min(
      bytes, shm_layout::round_up(bytes / static_cast<std::size_t>(size_), shm_layout::page));
  const std::size_t head = bytes - tail;
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !cross_copy(r, data + head, tail, head, true)) return false;
  } else {
    if (!read_from(root, data, head, 0)) return false;
    ++single_copy_reads_;
  }
  publish();
  return true;
}

// Every member says where its output lies and publishes; once all have, each writes its
// own block into every other member's output (process_vm_writev, starting with the member
// after it), publishes again, copies its block into its own output meanwhile, and returns
// once every member has written into it. Writing, not reading: the kernel's copy then reads
// lines this member's caches hold (its input, usually just written or just used) and
// stores into the others' outputs, where reading would fetch the other CPU's dirty lines
// one at a time. World 2 on the 2-vCPU VM of bench/RESULTS.md's twelfth entry, 9
// alternating runs: 1 MiB 0.93x the time of reading (0.74x with inputs rewritten before
// each allgather), 4 MiB 0.96x (0.94x), 16 MiB 0.91x (0.96x), 64 MiB 0.91x (0.96x).
// A member writes only after every member's publish of this allgather, so only into
// outputs of members waiting in it; it checks that none failed before each write, so that
// a member that timed out and returned gets nothing written into its tensor after it, short
// of a writer held off its CPU between that check and its write.
bool segment::allgather_write(const std::byte* own, std::size_t bytes, std::byte* dst,
                              const std::optional<shared_region>& region,
                              clock::time_point deadline) {
  say_source(dst, region);
  publish();
  if (!wait_all(phase_, deadline, "did not contribute")) return false;
  note_shared_allgather(bytes);
  const std::size_t at_offset = bytes * static_cast<std::size_t>(rank_);
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    if (auto by = head().failed_by.load(); by != 0 && by != rank_ + 1)
      return fail(make_error(errc::connection_lost, "rank ", world(by - 1),
                             " failed an operation of the group first"));
    if (!cross_copy(r, const_cast<std::byte*>(own), bytes, at_offset, true)) return false;
  }
  ++single_copy_reads_;
  publish();
  if (auto* mine = dst + at_offset; own != mine) std::memcpy(mine, own, bytes);
  return wait_all(phase_, deadline, "did not write its block into this member's output", false);
}

bool segment::read_members(const std::byte* own, std::size_t bytes, std::byte* dst,
                           clock::time_point deadline, bool through_pipes) {
  if (!(through_pipes ? read_pipes(bytes, dst) : read_memory(bytes, dst))) return false;
  ++single_copy_reads_;
  publish();
  if (auto* mine = dst + bytes * static_cast<std::size_t>(rank_); own != mine)
    std::memcpy(mine, own, bytes);
  return wait_all(phase_, deadline, "did not read this member's block", false);
}

}  // namespace troupe::collectives::gloo_shm
