// The collectives of a gloo group's shared-memory segment (shared_memory.hpp), with the
// invariants about who writes which slot when; the waits they use are in shared_memory_wait.cpp.
// Setting the segment up is in shared_memory_open.cpp, its layout in shm_layout.hpp.
#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/shared_host_memory.hpp>

#include <algorithm>
#include <cstring>

#include <troupe/collectives/gloo/blocks.hpp>
#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/collectives/gloo/shm_names.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

using shm_layout::descs;

// Operation kinds, as the members compare them.
constexpr std::uint32_t op_allreduce = 1, op_broadcast = 2, op_allgather = 3, op_barrier = 4,
                        op_reduce_scatter = 5;

// Allreduce works in chunks of at most this many bytes, less than a slot: a member's
// chunk is written once and read twice by every member (to fold a block, then to copy
// the result out), so the chunks of all members should fit in cache together. Measured
// best at 4 members on 2 cores between 128 KiB and 1 MiB (bench/RESULTS.md).
constexpr std::size_t allreduce_chunk_bytes = 256 << 10;
// Allreduces up to allreduce_big_chunk_max_bytes, when the members can all run at once, go
// in chunks of allreduce_big_chunk_bytes instead: a third of the syncs of 256 KiB chunks
// is worth more than the cache while the tensor is near the cache's size. World 2 on 2
// cores, alternating runs: 1 MiB 0.72x the time, 4 MiB 0.76x; but 16 MiB 1.18x, and at 4
// members on 2 cores (taking turns on a CPU) 1.3x at 4 MiB (bench/RESULTS.md).
constexpr std::size_t allreduce_big_chunk_bytes = 1 << 20;
constexpr std::size_t allreduce_big_chunk_max_bytes = 4 << 20;

// Allreduces up to this size (and one chunk) are folded whole by every member: one sync
// fewer than splitting the fold, which costs more than folding 64 KiB four times.
constexpr std::size_t fold_whole_max_bytes = 64 << 10;

// Broadcasts up to this size, when the members can all run at once, stream through a
// ring of ring_depth pieces at the start of the root's buffer: the root writes piece k
// while the others copy piece k - 1 out, and the root reuses a place once every other
// member has read what it held. A piece is a quarter of the data, from ring_min_piece to
// ring_max_piece: the copies overlap, and a broadcast takes four handoffs of a line
// between the CPUs at most up to 128 KiB, not one per 2 KiB. World 2 on 2 vCPUs (a system
// call 1.06 us), 6 alternating runs against 2 KiB pieces: 16 KiB 0.71x the time (1.03
// against 1.45 us), 32 KiB 0.58x, 64 KiB 0.39x (2.15 against 5.5 us copied once),
// 128 KiB 0.55x (against one copy); 7 runs of 5000, one 4 KiB piece against two of 2 KiB:
// 4 KiB 0.83x, 8 KiB 0.78x (inputs rewritten before each: 1.02x). With 2 KiB pieces the ring had
// stopped at 64 KiB, where reading the root's memory with a system call was faster than 32
// handoffs. At 4 members on 2 cores the root and the others take turns on a CPU, and a ring waits
// for each turn: whole slots there.
constexpr std::size_t ring_max_bytes = 256 << 10;
constexpr std::size_t ring_min_piece = 4 << 10;
constexpr std::size_t ring_max_piece = 32 << 10;
constexpr std::size_t ring_depth = 4;

// Broadcasts among members that all run at once copy the data once (segment::broadcast)
// where the members can read one another's memory or have their pipes: from
// segment::broadcast_once_from_, 16 KiB where reading another process's memory is cheap
// (measure_broadcast_once_from()), else ring_max_bytes, beneath which the ring's four
// handoffs cost less than reading with system calls of 1 us (see ring_max_bytes). Buffers
// that every member's last broadcast of those sizes found in shared host memory are copied
// once from shared_broadcast_once_from_ (64 KiB there), through the members' mappings and without
// a system call (segment::shared_broadcasts_). On the first VM (a 4 KiB allgather 1.3 us
// for Open MPI; bench/RESULTS.md, 2026-11-28, eleventh), medians of 15 runs before and
// after, against the ring of 2 KiB pieces and the slots: 64 KiB 0.52x the time, 256 KiB
// 0.25x, 1 MiB 0.18x, 4 MiB 0.29x, 16 MiB 0.52x, 64 MiB 0.77x. On a VM whose system calls
// cost 0.07 us (2026-11-29, nineteenth), 7 alternating runs at 16 KiB: one copy 0.46x the
// ring's time with ordinary memory, 0.18x with shared host tensors.
// Members that cannot all run at once (more than the CPUs) copy broadcasts once from this
// size, through the slots below it (segment::broadcast_slots): the others then read the
// root's data one after another on the CPUs they take turns on, each at its turn, where
// through a slot the root's one copy is done before they come. 4 members on the 2-vCPU VM,
// with the slots' single wait per chunk, against one copy (the others reading it all),
// 7-11 alternating runs: 1 MiB 0.49x, 0.79x and 1.14x the time in three A/Bs, 2 MiB
// 0.85x, 4 MiB 0.87x, 0.97x and 1.52x; from 4 MiB one copy splits the data between the
// root and the others (segment::broadcast_read).
constexpr std::size_t oversubscribed_broadcast_min_bytes = 4 << 20;
// ... and through the slots again from this size: the root's copy into its slot stays in
// the cache the others read it from, where each other member's read of the root's
// tensor fetches it from memory again, and the kernel pins its pages besides. 4 members
// on the 2-vCPU VM, one copy against the slots, 5-7 alternating runs: 4 MiB 0.91x and
// 0.99x the time, 8 MiB 1.03x, 16 MiB 1.12x, 32 MiB 1.27x, 64 MiB 1.28x.
constexpr std::size_t oversubscribed_broadcast_max_bytes = 16 << 20;
// Such members copy broadcasts once from this size when every member's buffer of the last
// broadcast of these sizes lay in a shared host buffer (segment::shared_broadcasts_): the
// others then copy from their mappings of the root's buffer without a system call, which
// takes fewer copies than the slots (where the root copies into its slot first) and none
// of the kernel's pinning of pages. 4 members on the 2-vCPU VM, shared buffers, 7
// alternating runs against the slots: 64 KiB 1.53x the time, 128 KiB 0.90x, 256 KiB 1.15x,
// 512 KiB 0.55x, 1 MiB 0.39x, 2 MiB 0.39x. Ordinary buffers keep the slots below 4 MiB
// (1 MiB read with system calls: 1.12x the slots' time) and from 16 MiB; shared ones are
// copied once at every size from here (16 MiB in 0.42x Open MPI's time, 64 MiB 0.37x).
constexpr std::size_t oversubscribed_shared_broadcast_min_bytes = 512 << 10;
// Allgathers from this size per member copy each block once, its owner writing it into the
// others' outputs (segment::allgather_write), where every member can reach the others'
// memory and the members can all run at once (beneath it the measured single-copy sizes
// end, at 192 KiB): two copies of each block instead of three (into the slot, its owner's
// own into the output, out of the slot). Same VM, world 2, 3 alternating runs of 300 at
// 2 MiB per member, reading the others' blocks: 0.47-0.61x the time of the slots.
// Members that outnumber the CPUs keep the slots unless every member's output of the last
// allgather from this size lay in a shared host buffer (segment::shared_allgathers_): then
// each writes its block into the others' outputs through its mappings of them. 4 members
// on the 2-vCPU VM, 5 alternating runs against the slots, 256 KiB-16 MiB per member:
// shared outputs 0.59-0.68x the time, ordinary ones (process_vm_writev) 1.15-1.64x.
constexpr std::size_t single_copy_allgather_min_bytes = 256 << 10;

// What a member that holds up the reuse of a buffer did not do.
constexpr const char* reuse_step = "did not finish reading an earlier chunk";

using gloo_blocks::block;

std::string describe_op(std::uint32_t kind, std::uint64_t bytes, std::uint32_t detail) {
  switch (kind) {
    case op_allreduce:
      return strcat("allreduce of ", bytes, " bytes (", to_string(static_cast<dtype>(detail >> 8)),
                    ", ", to_string(static_cast<reduce_op>(detail & 0xff)), ")");
    case op_broadcast:
      return strcat("broadcast of ", bytes, " bytes from rank ",
                    detail & ~shm_layout::buffer_shared);
    case op_allgather:
      return strcat("allgather of ", bytes, " bytes per rank");
    case op_reduce_scatter:
      return strcat("reduce_scatter of ", bytes, " bytes (",
                    to_string(static_cast<dtype>(detail >> 8)), ", ",
                    to_string(static_cast<reduce_op>(detail & 0xff)), ")");
    case op_barrier:
      return "barrier";
    default:
      return strcat("operation kind ", kind);
  }
}

}  // namespace

int segment::world(int r) const { return world_ranks_[static_cast<std::size_t>(r)]; }

std::string segment::what() const { return describe_op(kind_, bytes_, detail_); }

bool segment::fail(troupe::error e) {
  failure_ = std::move(e);
  return false;
}

expected<void> segment::failed() { return std::move(failure_); }

bool segment::begin(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes,
                    std::uint32_t detail) {
  if (aborted_.load()) return fail(make_error(errc::aborted, "the group is shutting down"));
  // The descriptions keep the sequence number's low 56 bits (shm_layout.hpp).
  seq_ = seq & ((std::uint64_t{1} << shm_layout::kind_shift) - 1);
  kind_ = kind;
  bytes_ = bytes;
  detail_ = detail;
  agreed_ = false;
  // By the count of this segment's operations, not by seq: the group's other operations
  // (over TCP) leave gaps in seq, where a member ahead would overwrite a description still
  // read. Within the segment, a member finishes no operation before every other one began
  // it, so it is never more than one ahead.
  desc_at_ = static_cast<std::size_t>(ops_++ % descs);
  if (run_at_once_) note_cpu();
  auto& d = at(rank_).desc[desc_at_];
  d.bytes_detail.store(bytes | static_cast<std::uint64_t>(detail) << shm_layout::detail_shift,
                       std::memory_order_relaxed);
  // Published by the next phase store, and by this release for members that compare
  // while they wait for this one (see wait()).
  d.seq_kind.store(seq_ | static_cast<std::uint64_t>(kind) << shm_layout::kind_shift,
                   std::memory_order_release);
  return true;
}

segment::described segment::read_desc(int r) const {
  auto& d = at(r).desc[desc_at_];
  const std::uint64_t seq_kind = d.seq_kind.load(std::memory_order_acquire);
  const std::uint64_t bytes_detail = d.bytes_detail.load(std::memory_order_relaxed);
  constexpr std::uint64_t seq_mask = (std::uint64_t{1} << shm_layout::kind_shift) - 1;
  constexpr std::uint64_t bytes_mask = (std::uint64_t{1} << shm_layout::detail_shift) - 1;
  return {seq_kind & seq_mask, static_cast<std::uint32_t>(seq_kind >> shm_layout::kind_shift),
          bytes_detail & bytes_mask,
          static_cast<std::uint32_t>(bytes_detail >> shm_layout::detail_shift)};
}

bool segment::check_agreement(int r) {
  const auto [seq, kind, bytes, detail] = read_desc(r);
  // Where an allgather's input or a broadcast's buffer lies is each member's own business
  // (shm_layout.hpp).
  const std::uint32_t mask =
      kind_ == op_allgather || kind_ == op_broadcast ? ~shm_layout::buffer_shared : ~0u;
  if (seq == seq_ && kind == kind_ && bytes == bytes_ && (detail & mask) == (detail_ & mask))
    return true;
  mark_failed();
  return fail(make_error(errc::invalid_argument, "the members disagree on collective #", seq_,
                         ": rank ", world(rank_), " (this one) runs ", what(), ", rank ", world(r),
                         seq == seq_ ? strcat(" runs ", describe_op(kind, bytes, detail))
                                     : strcat(" is at collective #", seq),
                         "; every member must call the same collectives with the same sizes, "
                         "dtypes, reductions and roots, in the same order"));
}

bool segment::all_shared() const {
  for (int r = 0; r < size_; ++r)
    if ((read_desc(r).detail & shm_layout::buffer_shared) == 0) return false;
  return true;
}

void segment::note_shared_broadcast(std::size_t bytes) {
  if (bytes >=
      (run_at_once_ ? shared_broadcast_once_from_ : oversubscribed_shared_broadcast_min_bytes))
    shared_broadcasts_ = all_shared();
}

std::size_t segment::ordinary_broadcast_once_from(std::size_t measured) noexcept {
  return measured < (64 << 10) ? measured : ring_max_bytes;
}

void segment::note_shared_allgather(std::size_t bytes) {
  if (!run_at_once_ && bytes >= single_copy_allgather_min_bytes) shared_allgathers_ = all_shared();
}

expected<void> segment::allreduce(std::uint64_t seq, tensor_view t, reduce_op op,
                                  const cpu_reduce_fn& fn, std::size_t divisor,
                                  clock::time_point deadline) {
  // Empty operations move nothing and wait for nobody: they take no description either
  // (see begin()), or a member could run ahead by any number of them.
  if (t.numel == 0) return ok();
  const std::size_t es = element_size(t.type);
  if (!begin(seq, op_allreduce, t.nbytes(),
             (static_cast<std::uint32_t>(t.type) << 8) | static_cast<std::uint32_t>(op)))
    return failed();
  const bool big_chunks = run_at_once_ && t.nbytes() <= allreduce_big_chunk_max_bytes;
  const std::size_t chunk_bytes =
      std::min(slot_bytes_, big_chunks ? allreduce_big_chunk_bytes : allreduce_chunk_bytes);
  const std::size_t per_chunk = chunk_bytes / es;
  const bool fold_whole = t.nbytes() <= std::min(fold_whole_max_bytes, chunk_bytes);
  auto* data = static_cast<std::byte*>(t.data);
  for (std::size_t off = 0; off < t.numel; off += per_chunk) {
    const std::size_t count = std::min(per_chunk, t.numel - off);
    const std::uint64_t c = chunks_++;
    std::byte* const mine = data + off * es;
    if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return failed();
    const auto own = block(count, size_, rank_);
    if (fold_whole) {
      std::memcpy(slot(rank_, c), mine, count * es);
    } else {
      // The others read only their own blocks of this slot; this member folds its block
      // from its tensor, so that block is not copied in.
      if (own.offset > 0) std::memcpy(slot(rank_, c), mine, own.offset * es);
      const std::size_t after = own.offset + own.count;
      if (after < count)
        std::memcpy(slot(rank_, c) + after * es, mine + after * es, (count - after) * es);
    }
    publish();
    if (!wait_all(phase_, deadline, "did not contribute")) return failed();
    if (fold_whole) {
      // Every member folds everything, in rank order, into its own tensor.
      fn(mine, slot(0, c), slot(1, c), count);
      for (int r = 2; r < size_; ++r) fn(mine, mine, slot(r, c), count);
      if (divisor > 1) cpu_divide({mine, t.type, count, t.where}, divisor);
      guard_[c & 1] = phase_ + 1;  // read: see guard_
      continue;
    }
    // Member r folds block r of the chunk in rank order (its own contribution read from its
    // tensor, the others' from their slots) into that block of its slot, which held nothing
    // yet, and the others copy the result from there.
    if (own.count > 0) {
      auto src = [&](int r) { return (r == rank_ ? mine : slot(r, c)) + own.offset * es; };
      std::byte* const acc = slot(rank_, c) + own.offset * es;
      fn(acc, src(0), src(1), own.count);
      for (int r = 2; r < size_; ++r) fn(acc, acc, src(r), own.count);
      if (divisor > 1) cpu_divide({acc, t.type, own.count, t.where}, divisor);
    }
    publish();
    if (!wait_all(phase_, deadline, "did not reduce its block")) return failed();
    for (int r = 0; r < size_; ++r) {
      const auto theirs = block(count, size_, r);
      std::memcpy(mine + theirs.offset * es, slot(r, c) + theirs.offset * es, theirs.count * es);
    }
    guard_[c & 1] = phase_ + 1;  // read: see guard_
  }
  return ok();
}

// Piece k of the data goes through place k % ring_depth of the ring (see ring_max_bytes).
// Every member publishes once per piece: the root when it wrote the piece, the others when
// they copied it out, so the phases stay in step as they do for whole chunks, and the root
// may overwrite a place once the others' phases show that they read its last piece.
bool segment::broadcast_ring(std::byte* data, std::size_t bytes, int root,
                             clock::time_point deadline) {
  const std::uint64_t c = chunks_++;
  const std::uint64_t base = phase_;
  std::byte* const ring = slot(root, c);
  // A quarter of the data on whole cache lines (see ring_max_bytes); smaller pieces, and
  // fewer, in a slot set smaller than the ring.
  const std::size_t quarter = shm_layout::round_up(bytes / ring_depth, 64);
  const std::size_t piece = std::max<std::size_t>(
      1, std::min(std::clamp(quarter, ring_min_piece, ring_max_piece), slot_bytes_ / ring_depth));
  const std::size_t depth = std::min(ring_depth, slot_bytes_ / piece);
  const std::size_t pieces = (bytes + piece - 1) / piece;
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t off = k * piece;
    const std::size_t len = std::min(piece, bytes - off);
    std::byte* const place = ring + (k % depth) * piece;
    if (rank_ == root) {
      // The first round of places was last read in an earlier operation (guard_).
      const std::uint64_t read = k < depth ? guard_[c & 1] : base + k - depth + 1;
      if (!wait_all(read, deadline, reuse_step, false)) return false;
      std::memcpy(place, data + off, len);
    } else {
      if (!wait_one(root, base + k + 1, deadline, "did not write the data")) return false;
      std::memcpy(data + off, place, len);
    }
    publish();
  }
  if (rank_ == root) guard_[c & 1] = phase_;
  return true;
}

// Chunk by chunk through the root's slot, as an allgather's blocks: the root copies the
// chunk in and publishes, the others publish on arriving, and once every member has, each
// other member copies the chunk out. That one wait is where the members compare what they
// were asked to do (the first chunk's), so no wait follows the last chunk: the root
// returns once all arrived, the others once they have the data, and the root rewrites a
// buffer of its slot only after every other member's next publish (guard_), which each
// makes only after it read the chunk. The root's tensor is left as it was when it copied
// it in. 4 members on 2 vCPUs, 9 alternating runs against the root publishing first and
// everyone waiting for all to have the data at the end: 4 KiB-256 KiB 0.69-0.74x the time.
bool segment::broadcast_slots(std::byte* data, std::size_t bytes, int root,
                              clock::time_point deadline) {
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t len = std::min(slot_bytes_, bytes - off);
    const std::uint64_t c = chunks_++;
    if (rank_ == root) {
      if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return false;
      std::memcpy(slot(rank_, c), data + off, len);
    }
    publish();
    if (!wait_all(phase_, deadline,
                  off == 0 ? "did not arrive" : "did not go on to the next chunk"))
      return false;
    if (off == 0) note_shared_broadcast(bytes);
    if (rank_ != root)
      std::memcpy(data + off, slot(root, c), len);
    else
      guard_[c & 1] = phase_ + 1;  // read: see guard_
  }
  return true;
}

expected<void> segment::broadcast(std::uint64_t seq, tensor_view t, int root,
                                  clock::time_point deadline) {
  if (t.numel == 0) return ok();  // as allreduce's
  auto* data = static_cast<std::byte*>(t.data);
  const std::size_t bytes = t.nbytes();
  // One copy from broadcast_once_from_, from 4 MiB to 16 MiB when the members outnumber
  // the CPUs (see above): reading the root's memory where every member can, else through the
  // pipes. From shared_broadcast_once_from_ (512 KiB when the members outnumber the CPUs) one copy
  // too when every member's buffer of the last broadcast of those sizes was shared (the same
  // on every member, from the descriptions all read), and each says whether its buffer is
  // for the next.
  const std::size_t once_from =
      run_at_once_ ? shared_broadcast_once_from_ : oversubscribed_shared_broadcast_min_bytes;
  const auto region =
      bytes >= once_from && single_copy_ != 0 ? find_shared_region(data, bytes) : std::nullopt;
  if (!begin(seq, op_broadcast, bytes,
             static_cast<std::uint32_t>(root) | (region ? shm_layout::buffer_shared : 0)))
    return failed();
  const bool plain_once =
      single_copy_ != 0 && (run_at_once_ ? bytes >= broadcast_once_from_
                                         : bytes >= oversubscribed_broadcast_min_bytes &&
                                               bytes < oversubscribed_broadcast_max_bytes);
  const bool shared_once = single_copy_ != 0 && bytes >= once_from && shared_broadcasts_;
  if ((plain_once || shared_once) && !learn_readers(deadline)) return failed();
  // Through the mappings only where every member can reach the others' memory; else, as
  // for ordinary buffers, the slots.
  const bool one_copy = plain_once || (shared_once && all_read_ == 1);
  if (one_copy && all_read_ == 1) {
    if (!broadcast_read(data, bytes, root, region, deadline)) return failed();
  } else if (one_copy && use_pipes_) {
    if (!broadcast_pipes(data, bytes, root, deadline)) return failed();
  } else if (run_at_once_ && bytes <= ring_max_bytes) {
    if (!broadcast_ring(data, bytes, root, deadline)) return failed();
  } else {
    return broadcast_slots(data, bytes, root, deadline) ? ok() : failed();
  }
  // On these paths every member waits until every other one has its data, and compares
  // what each was asked to do: otherwise a root would return at once, never learning that
  // the others took another member for the root or another size, and the members would go
  // on with different data (the slots compare at their one wait, which all members pass).
  // Every member's description of this broadcast stays until all have finished it (see
  // begin()): whether all buffers were shared, for the next.
  agreed_ = false;
  if (!wait_all(phase_, deadline, "did not read the data")) return failed();
  note_shared_broadcast(bytes);
  return ok();
}

expected<void> segment::allgather(std::uint64_t seq, tensor_view in, tensor_view out,
                                  clock::time_point deadline) {
  const std::size_t bytes = in.nbytes();
  if (bytes == 0) return ok();  // as allreduce's
  auto* dst = static_cast<std::byte*>(out.data);
  const auto* src = static_cast<const std::byte*>(in.data);
  auto block_of = [&](int r) { return dst + bytes * static_cast<std::size_t>(r); };
  // When `in` lies outside `out`, this member's own block is copied into `out` after its
  // slot is published, while the others copy theirs: off the path they wait on. When it
  // overlaps `out` (in place, or elsewhere in it), it is moved there first, as the others'
  // blocks may land on it.
  const bool apart = src + bytes <= dst || dst + out.nbytes() <= src;
  const std::byte* const own = apart ? src : block_of(rank_);
  // Whether the others may read this member's block where it lies in a shared host buffer
  // (only where mapped reads may be taken: segment::allgather_single_copy), or, from the
  // size where the blocks are written into the outputs, write into its output through
  // their mappings of it: the description's bit says which of the two is shared.
  const bool measured_size = run_at_once_ && in_single_copy_range(bytes);
  const bool writes = bytes >= single_copy_allgather_min_bytes && single_copy_ != 0;
  const auto own_region = measured_size ? find_shared_region(own, bytes) : std::nullopt;
  const auto out_region = writes ? find_shared_region(dst, out.nbytes()) : std::nullopt;
  if (!begin(seq, op_allgather, bytes, own_region || out_region ? shm_layout::buffer_shared : 0))
    return failed();
  if (!apart && block_of(rank_) != src) std::memmove(block_of(rank_), src, bytes);
  switch (allgather_single_copy(own, bytes, own_region, dst, deadline)) {
    case single_copy_outcome::read:
      note_sample();
      return ok();
    case single_copy_outcome::failed:
      return failed();
    case single_copy_outcome::slots:
      break;
  }
  // Above the measured sizes, when the members can all run at once and reach one another's
  // memory: one copy of each block, as Open MPI's, instead of two through the slots and
  // the member's own block copied into its slot besides. Members that cannot all run at
  // once do so when every member's last output of these sizes was shared (the same on
  // every member, from the descriptions all read).
  if (writes && (run_at_once_ || shared_allgathers_)) {
    if (!learn_readers(deadline)) return failed();
    if (all_read_ == 1)
      return allgather_write(own, bytes, dst, out_region, deadline) ? ok() : failed();
  }
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t len = std::min(slot_bytes_, bytes - off);
    const std::uint64_t c = chunks_++;
    if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return failed();
    std::memcpy(slot(rank_, c), own + off, len);
    publish();
    if (apart) std::memcpy(block_of(rank_) + off, own + off, len);
    if (!wait_all(phase_, deadline, "did not contribute")) return failed();
    if (measured_size && off == 0) tuners_[size_class(bytes)].all_shared = all_shared();
    if (off == 0) note_shared_allgather(bytes);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) std::memcpy(block_of(r) + off, slot(r, c), len);
    guard_[c & 1] = phase_ + 1;  // read: see guard_
  }
  note_sample();
  return ok();
}

expected<void> segment::reduce_scatter(std::uint64_t seq, tensor_view in, tensor_view out,
                                       reduce_op op, const cpu_reduce_fn& fn,
                                       clock::time_point deadline) {
  if (out.numel == 0) return ok();  // as allreduce's
  const std::size_t es = element_size(in.type);
  if (!begin(seq, op_reduce_scatter, in.nbytes(),
             (static_cast<std::uint32_t>(in.type) << 8) | static_cast<std::uint32_t>(op)))
    return failed();
  const auto members = static_cast<std::size_t>(size_);
  const std::size_t per_rank = out.numel;
  // Each chunk takes the same piece of every block: a member's slot holds its n pieces,
  // and member r folds piece r of every slot into its output.
  // Chunks as the allreduce's, large ones included: world 2, 11 alternating runs with
  // fresh inputs, 1 MiB 0.75x and 4 MiB 0.77x the time of 256 KiB chunks.
  const bool big_chunks = run_at_once_ && in.nbytes() <= allreduce_big_chunk_max_bytes;
  const std::size_t chunk_bytes =
      std::min(slot_bytes_, big_chunks ? allreduce_big_chunk_bytes : allreduce_chunk_bytes);
  const std::size_t piece = std::max<std::size_t>(1, chunk_bytes / es / members);
  const auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  const auto me = static_cast<std::size_t>(rank_);
  // In place: `out` is this member's own block of `in`, so the fold must not write it
  // before it read it (see below).
  const bool in_place = dst == src + me * per_rank * es;
  for (std::size_t off = 0; off < per_rank; off += piece) {
    const std::size_t count = std::min(piece, per_rank - off);
    const std::uint64_t c = chunks_++;
    if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return failed();
    std::byte* const mine = slot(rank_, c);
    // This member's own piece is folded from its input, not copied in.
    for (std::size_t b = 0; b < members; ++b)
      if (b != me) std::memcpy(mine + b * count * es, src + (b * per_rank + off) * es, count * es);
    publish();
    if (!wait_all(phase_, deadline, "did not contribute")) return failed();
    auto part = [&](int r) {
      return r == rank_ ? src + (me * per_rank + off) * es : slot(r, c) + me * count * es;
    };
    // Folded in rank order into `acc`, the last step into `o`. In place, `acc` is piece
    // `me` of this member's slot, which nobody reads (its own piece is not copied in), so
    // that `o` (its own piece of `in`) is read before the last step writes it.
    std::byte* const o = dst + off * es;
    std::byte* const acc = in_place ? mine + me * count * es : o;
    fn(size_ == 2 ? o : acc, part(0), part(1), count);
    for (int r = 2; r < size_; ++r) fn(r == size_ - 1 ? o : acc, acc, part(r), count);
    guard_[c & 1] = phase_ + 1;  // read: see guard_
  }
  return ok();
}

expected<void> segment::barrier(std::uint64_t seq, clock::time_point deadline) {
  if (!begin(seq, op_barrier, 0, 0)) return failed();
  publish();
  return wait_all(phase_, deadline, "did not arrive") ? ok() : failed();
}

}  // namespace troupe::collectives::gloo_shm
