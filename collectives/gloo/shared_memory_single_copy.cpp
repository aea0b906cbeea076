// The single-copy allgather of a gloo group's shared-memory segment (shared_memory.hpp,
// segment::allgather): each member reads the others' blocks from their own memory with
// process_vm_readv instead of through the slots. Whether the members may read one
// another is found in open() (shared_memory_open.cpp); the slots and their invariants are
// in shared_memory.cpp, which runs the allgather when this declines.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// Allgathers of single_copy_min_bytes to single_copy_max_bytes per member, when the members
// can all run at once and read one another's memory, read the others' blocks where they
// lie (process_vm_readv): one copy of each block instead of two through a slot, for a
// publish more (every member must have read a member's input before it returns). World 2
// on 2 cores, 9 alternating runs against the slots (bench/RESULTS.md):
// - unchanged inputs, in both CPUs' caches: 16 KiB per member 1.42x the time, 32 KiB
//   0.93x, 64 KiB 0.79x, 128 KiB 0.70x, 160 KiB 0.78x, 192 KiB 0.93x, 256 KiB 1.24x (the
//   kernel pins the pages, which costs more than its copy; two user copies through the
//   caches win again above);
// - inputs rewritten just before: 32 KiB 1.26x, 64 KiB 1.08x, 128 KiB 1.14x (the lines
//   are dirty in the writer's cache; not the publish more, whose wait costs nothing here);
// - inputs evicted from the caches before: 32 KiB 1.41-1.48x, 64 KiB 1.01-1.16x,
//   128 KiB 0.81-1.27x.
// Hence from 64 KiB, where it wins most with cached inputs and loses least otherwise, and
// only when every member asks (open_options::single_copy, TROUPE_GLOO_SHM_SINGLE_COPY=1):
// a training step's inputs are mostly just written or long evicted. At 4 members on 2
// cores (taking turns on a CPU) the publish more cost 1.1-2x the time at every size.
constexpr std::size_t single_copy_min_bytes = 64 << 10;
constexpr std::size_t single_copy_max_bytes = 160 << 10;

}  // namespace

// Every member says where its input lies and publishes; once all have, each reads the
// others' blocks from their memory into its output, publishes again, and returns once all
// have read (its input must not change or go away before). When the members' flags show
// that one of them cannot read the others', the caller copies through the slots after all
// (the publish here is then one more, which nothing waits for), and later allgathers go
// there directly. Every member takes the same path: the window and run_at_once_ are the
// same everywhere, and so is single_copy_ once known.
segment::single_copy_outcome segment::allgather_single_copy(const std::byte* own, std::size_t bytes,
                                                            std::byte* dst,
                                                            clock::time_point deadline) {
  if (!run_at_once_ || bytes < single_copy_min_bytes || bytes > single_copy_max_bytes ||
      single_copy_ == 0)
    return single_copy_outcome::slots;
  auto block_of = [&](int r) { return dst + bytes * static_cast<std::size_t>(r); };
  at(rank_).source.store(reinterpret_cast<std::uintptr_t>(own), std::memory_order_relaxed);
  publish();
  if (own != block_of(rank_)) std::memcpy(block_of(rank_), own, bytes);
  if (!wait_all(phase_, deadline, "did not contribute")) return single_copy_outcome::failed;
  if (single_copy_ < 0) {
    single_copy_ = 1;
    for (int r = 0; r < size_; ++r)
      if (at(r).single_copy.load(std::memory_order_relaxed) != 1) single_copy_ = 0;
  }
  if (single_copy_ == 0) return single_copy_outcome::slots;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto pid = static_cast<pid_t>(at(r).pid.load(std::memory_order_relaxed));
    const auto from = static_cast<std::uintptr_t>(at(r).source.load(std::memory_order_relaxed));
    for (std::size_t done = 0; done < bytes;) {
      iovec local{block_of(r) + done, bytes - done};
      iovec remote{reinterpret_cast<void*>(from + done), bytes - done};
      const auto n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (n <= 0) {
        const int e = n < 0 ? errno : EIO;
        mark_failed();
        if (e == ESRCH)
          fail(make_error(errc::connection_lost, "rank ", world(r), " (pid ", pid,
                          ") exited during ", what(), " (collective #", seq_, ")"));
        else
          fail(make_error(errc::connection_lost, what(), " (collective #", seq_, "): reading rank ",
                          world(r), "'s block from its memory failed (", std::strerror(e),
                          "); unset TROUPE_GLOO_SHM_SINGLE_COPY to copy blocks through shared "
                          "memory instead"));
        return single_copy_outcome::failed;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  publish();
  return wait_all(phase_, deadline, "did not read this member's block", false)
             ? single_copy_outcome::read
             : single_copy_outcome::failed;
}

}  // namespace troupe::collectives::gloo_shm
