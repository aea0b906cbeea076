// shared_host_memory: host memory that the other processes of this host can map, for the
// tensors a process hands to the gloo backend's collectives. Between members of one host,
// a collective copies large tensors from one member's memory into another's once; for
// ordinary memory that copy is a system call (process_vm_readv or process_vm_writev), which
// pins the pages on every call and took 2-4x the time of a plain copy from 64 KiB to 16 MiB
// on the 2-vCPU VM of bench/RESULTS.md. A tensor allocated here lies in a memory file of
// its own (memfd): the other members map it the first time they meet it (they take the
// descriptor from this process with pidfd_getfd, which the kernel allows where it allows
// process_vm_readv) and from then on copy it with plain loads and stores. Nothing is
// named in /dev/shm, so nothing is left behind when a process dies. docs/collectives.md,
// "Shared host tensors".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collectives/tensor.hpp>

namespace troupe::collectives {

/// A contiguous CPU tensor of zeros of `type` and `shape` in shared host memory (see the
/// file comment). It behaves as any CPU tensor; collectives of the gloo backend copy it
/// between members of one host without system calls, in both directions (as input and as
/// output). The memory is reserved when allocated (rounded up to 4 KiB pages) and freed
/// when the last copy of the tensor and of its owner() goes: its pages then go at once,
/// also from the other members' mappings of it. Fails with invalid_argument
/// for a negative dimension or a dtype outside the enum, and with unavailable, naming the
/// size and the reason, when the system refuses the memory (memory or file limits).
expected<tensor> shared_host_tensor(dtype type, std::vector<std::int64_t> shape);

/// Where a shared host buffer lies in this process: the descriptor that holds its memory
/// file, an id unique within this process for its lifetime (never reused, never 0), and
/// its address range here.
struct shared_region {
  int fd = -1;
  std::uint64_t id = 0;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
};

/// The shared host buffer of this process that holds all of [p, p + bytes), if one does.
/// Thread-safe; a lookup takes a lock and a search among the live buffers.
std::optional<shared_region> find_shared_region(const void* p, std::size_t bytes) noexcept;

/// The name every shared host buffer's memory file carries (seen in /proc/<pid>/fd as
/// "/memfd:<name> (deleted)"), made from its id; the members that map a buffer check it.
std::string shared_region_name(std::uint64_t id);

}  // namespace troupe::collectives
