// peer_regions: the other members' shared host buffers (shared_host_memory.hpp) that this
// member of a gloo group's shared-memory segment has mapped, so that single-copy
// operations copy from and into them with plain loads and stores instead of
// process_vm_readv and process_vm_writev.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <troupe/collectives/shared_host_memory.hpp>

namespace troupe::collectives::gloo_shm {

class peer_regions {
 public:
  peer_regions() = default;
  peer_regions(const peer_regions&) = delete;
  peer_regions& operator=(const peer_regions&) = delete;
  /// Unmaps every buffer mapped.
  ~peer_regions();

  /// Where [theirs, theirs + bytes) of process `pid` is mapped in this process, given that
  /// `pid` said (during the running operation, which keeps it alive) that the range lies in
  /// its buffer `region`; null when it does not or the buffer cannot be mapped (the caller
  /// then copies with a system call). The first call for a buffer maps it: it takes the
  /// descriptor from `pid` (pidfd_getfd), checks that it is that buffer's memory file, and
  /// maps all of it. A process whose buffers cannot be taken is not asked again. Mappings
  /// of buffers that their owner has since freed are dropped when that owner's next new
  /// buffer is mapped, and at most max_mapped stay mapped (the oldest go first).
  std::byte* local(pid_t pid, const shared_region& region, std::uintptr_t theirs,
                   std::size_t bytes);
  /// How many buffers this member has mapped so far, and how many are mapped now.
  std::uint64_t mapped_total() const noexcept { return mapped_total_; }
  std::size_t mapped_now() const noexcept { return entries_.size(); }

  static constexpr std::size_t max_mapped = 64;

 private:
  struct entry {
    pid_t pid;
    shared_region theirs;  // as its owner published it
    std::byte* here;
  };
  // Maps `region` of `pid`; null when it cannot (logged once per process).
  std::byte* map(pid_t pid, const shared_region& region);
  // Unmaps the buffers of `pid` whose descriptors no longer hold their memory files.
  void drop_freed(pid_t pid);
  void unmap(const entry& e) noexcept;

  std::vector<entry> entries_;
  std::vector<pid_t> refused_;
  std::uint64_t mapped_total_ = 0;
};

}  // namespace troupe::collectives::gloo_shm
