// The layout of a gloo group's shared-memory segment (shared_memory.hpp): its header, the
// members' lines and where the slots lie. Internal to collectives/gloo, included by the two
// files that implement gloo_shm::segment: shared_memory_open.cpp (creating, attaching and
// agreeing on a segment) and shared_memory.cpp (the waits and the collectives).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <troupe/collectives/gloo/shared_memory.hpp>

namespace troupe::collectives::gloo_shm {

namespace shm_layout {

inline constexpr std::uint64_t magic = 0x74726f7570652d73;  // "troupe-s"
inline constexpr std::uint32_t version = 10;
// The bit of a member's `source` that says its data lies in a shared host buffer (user
// addresses stay below 2^57 on x86-64 and arm64, so the top bit is free).
inline constexpr std::uint64_t in_shared_region = std::uint64_t{1} << 63;
// The bit of an allgather's or a broadcast's description detail that says the member's
// buffer that the others would copy from or into lies in a shared host buffer (an
// allgather's input where the others read it, its output where they write into it; a
// broadcast's buffer): not compared when the members check that they agree, read by all
// after the first wait (segment::all_shared()). Above a broadcast's root, which is below
// max_members.
inline constexpr std::uint32_t buffer_shared = 1u << 15;
// The bit of a member's single_copy flag that says it can read the others' memory.
inline constexpr std::uint32_t reads_memory = 4;
inline constexpr std::size_t page = 4096;
// Operations of the segment a member can be ahead of another, and more: a member finishes
// no operation before every other one began it, so one ahead at most. Indexed by the
// count of the segment's operations (segment::begin()).
inline constexpr std::size_t descs = 3;
// An operation's description packs its kind above a 56-bit sequence number and its detail
// (a root, or dtype and reduction) above a 48-bit byte count: a root is a member of one
// host's segment, below max_members, which leaves the detail's top bit to buffer_shared.
inline constexpr int kind_shift = 56;
inline constexpr int detail_shift = 48;
inline constexpr int max_members = 1 << 15;

constexpr std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace shm_layout

// The segment: a header line, one block of lines per member, then the slots (page
// aligned), member r's buffer b at data + (2r + b) * slot_bytes.
struct segment::header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t members;
  std::uint64_t slot_bytes;
  std::uint64_t token;
  // Whether the members are not more than the CPUs rank 0 may run on (so that they can
  // all run at once): rank 0's view, so that every member splits an operation the same way.
  std::uint32_t run_at_once;
  // Whether rank 0 made the pipes of single-copy allgathers (shared_memory_pipes.cpp), one
  // per ordered pair of members, named after the segment.
  std::uint32_t pipes;
  // From how many bytes broadcasts among members that all run at once copy the data once
  // (segment::broadcast): rank 0's measure, so that every member takes the same path.
  std::uint64_t broadcast_once_from;
  std::atomic<std::int32_t> failed_by;          // 0, or the failed member's rank + 1
  alignas(64) std::atomic<std::uint32_t> wake;  // futex word, bumped by every publish
  std::atomic<std::uint32_t> sleepers;
};

// What a member runs: its collective number (the low 56 bits), kind, bytes and detail.
// Written before the operation's first publish, the first word last (a release), read
// the first word first (an acquire).
struct segment::op_desc {
  std::atomic<std::uint64_t> seq_kind;      // seq | kind << kind_shift
  std::atomic<std::uint64_t> bytes_detail;  // bytes | detail << detail_shift
};

// The phase and the descriptions share the member's first line: a member that sees
// another's phase move has its description too, without fetching a second line.
struct alignas(64) segment::member {
  std::atomic<std::uint64_t> phase;
  op_desc desc[shm_layout::descs];
  // Where the running single-copy allgather's input lies in this member's address space
  // (segment::allgather): written before the operation's first publish.
  std::atomic<std::uint64_t> source;
  alignas(64) std::atomic<std::int64_t> pid;
  std::atomic<std::uint64_t> start;
  std::atomic<std::uint64_t> pid_ns;
  // Where this member mapped the segment (read by the others' probe in open()), and what
  // it can do and asks for: in the low two bits, for single-copy allgathers, 1 when it can
  // (through the pipes or reading the others' memory) and asks to always, 3 when it can
  // and asks to measure, 2 when it cannot or asks not to; plus reads_memory when its probe
  // read every other member's memory (large broadcasts, segment::broadcast()).
  std::atomic<std::uint64_t> map_address;
  std::atomic<std::uint32_t> single_copy;
  // The least capacity in bytes of the pipes this member writes to, 0 when it has none
  // (shared_memory_pipes.cpp): written before the member answers the offer.
  std::atomic<std::uint32_t> pipe_bytes;
  // The single-copy tuner's best times at its last exchange (the slots', then reading the
  // others' memory), in ns: written before the exchanging allgather's first publish
  // (shared_memory_single_copy.cpp).
  struct times {
    std::atomic<std::uint32_t> op;
    std::atomic<std::uint32_t> period;
  } timed[2];
  // The CPU this member ran on when it last began an operation, plus one (0: not known);
  // written only when it changes (segment::begin(), segment::wait()).
  std::atomic<std::uint32_t> cpu;
  // When `source` has the in_shared_region bit, it lies in a shared host buffer of this
  // member (shared_host_memory.hpp): the descriptor it holds the buffer by, the buffer's
  // id and its range in this member's address space. Written before `source`.
  std::atomic<std::int32_t> region_fd;
  std::atomic<std::uint64_t> region_id;
  std::atomic<std::uint64_t> region_base;
  std::atomic<std::uint64_t> region_bytes;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

inline segment::header& segment::head() const noexcept { return *static_cast<header*>(map_); }

inline segment::member& segment::at(int r) const noexcept {
  auto* base = static_cast<std::byte*>(map_) + shm_layout::round_up(sizeof(header), 64);
  return reinterpret_cast<member*>(base)[r];
}

inline std::byte* segment::slot(int r, std::uint64_t chunk) const noexcept {
  return static_cast<std::byte*>(map_) + data_offset_ +
         (2 * static_cast<std::size_t>(r) + (chunk & 1)) * slot_bytes_;
}

}  // namespace troupe::collectives::gloo_shm
