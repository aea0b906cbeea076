// Shared memory between the members of a gloo group on one host. Internal to
// collectives/gloo; used by the thread running the group's current operation only
// (abort() excepted).
//
// Over loopback TCP every byte of a collective is copied into the kernel by the sender and
// out of it by the receiver, with a system call per transfer. When every member runs on
// the same host, the group instead maps one segment of shared memory in which each member
// owns two slots (double buffering). A member copies its part of a tensor into its slot
// once; the others read it from there. Members signal progress through one counter each
// ("phase"); a waiter spins briefly when the members can all run at once, then polls,
// yielding its CPU between polls, for up to 100 us, then sleeps on one futex word.
//
// Failure: a wait ends at the operation's deadline with an error naming the members that
// did not get there; a member whose process exited is noticed within tens of
// milliseconds (its pid and start time are checked while waiting); a member that failed
// marks the segment failed, which wakes and fails every other member at once; the members
// compare what each was asked to do, so that different sizes or roots fail with an error
// naming them instead of mixing data.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/peer_regions.hpp>
#include <troupe/collectives/tensor.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe::collectives::gloo_shm {

/// Bytes of one slot when TROUPE_GLOO_SHM_SLOT is not set: large enough that a 64 MiB
/// operation syncs a few hundred times at most, small enough that a chunk is still in
/// cache when the other members read it.
inline constexpr std::size_t default_slot_bytes = 1 << 20;

/// Whether a member lets allgathers read blocks straight from the others' memory (see
/// segment::allgather()): never; when the group measured it to be faster (the default);
/// or always, at the sizes where it may.
enum class single_copy_mode : std::uint8_t { off, measured, always };

struct open_options {
  int rank = 0;
  int size = 1;
  /// World rank of each member, for errors.
  std::vector<int> world_ranks;
  /// The group as errors name it, e.g. "group 'world' (gloo, 4 ranks)".
  std::string group;
  /// Whether this member wants shared memory (TROUPE_GLOO_SHM=0 says no). One member
  /// saying no turns it off for all.
  bool enabled = true;
  /// Bytes per slot; rank 0's choice holds for every member. Rounded up to 4 KiB.
  std::size_t slot_bytes = default_slot_bytes;
  /// Whether this member lets allgathers read blocks straight from the others' memory
  /// (TROUPE_GLOO_SHM_SINGLE_COPY: 0 off, auto measured, 1 always; see allgather()). One
  /// member saying off turns it off for all; it is always on only when all say always.
  single_copy_mode single_copy = single_copy_mode::measured;
  /// Whether single-copy allgathers may hand blocks over through pipes (vmsplice), which
  /// need no permission to read the others' memory and pin pages faster, before
  /// process_vm_readv; rank 0's choice holds for every member. Off only to test the other.
  bool pipes = true;
  /// Whether this member may read the others' memory (process_vm_readv) where the system
  /// lets it: single-copy allgathers without pipes, large ones, and broadcasts. Off only to
  /// test the pipes.
  bool reads = true;
  duration timeout = std::chrono::seconds(30);
};

/// The rule by which allgathers measured (single_copy_mode::measured) choose their way,
/// from the members' best times summed, [0] through the slots and [1] reading the others'
/// memory, of the allgathers alone (`op`) and from their start to the next one's
/// (`period`): whether the next cycle reads, given whether this one did (`reading`).
/// Reading takes over when it took under 95% of the slots' time by both measures; it stays
/// while it takes no longer than the slots by either.
bool reads_next(bool reading, const std::uint64_t (&op)[2], const std::uint64_t (&period)[2]);

/// TROUPE_GLOO_SHM ("0" turns it off), TROUPE_GLOO_SHM_SLOT (bytes) and
/// TROUPE_GLOO_SHM_SINGLE_COPY ("0" off, "auto" measured, "1" always) applied to `o`.
void apply_env(open_options& o);

class segment {
 public:
  /// Collective over `s`, which must be namespaced for this group: rank 0 creates the
  /// segment and offers its name, every other member maps it and says whether it could.
  /// Every member gets the same answer: a segment when all could, nullptr when any could
  /// not (another host or IPC namespace, no room in /dev/shm, turned off); why is logged.
  /// An error only when the store fails or a member does not answer within the timeout.
  /// The name is unlinked once every member has answered, so nothing is left behind.
  static expected<std::unique_ptr<segment>> open(store& s, const open_options& o);

  ~segment();
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;

  // The operations below are collective over the members, numbered by the group's
  // collective count `seq` (the same on every member). They fail with errc::timeout at
  // `deadline`, naming the members that did not arrive; errc::connection_lost when a
  // member exited or failed first; errc::invalid_argument when the members disagree on
  // the operation, its size or its root; errc::aborted after abort(). After a failure the
  // segment is unusable (the group's failure is sticky).

  /// Allreduce in place; `fn` combines two runs of elements. Every member folds in rank
  /// order (r0 op r1 op ...), so every member gets bit-identical results, the same as the
  /// TCP algorithms give. With `divisor` > 1 (avg) every element of the result is divided
  /// by it right after its fold, while the member that folded it has it in cache, instead
  /// of in a pass of its own afterwards; `op` only names the operation (agreement, errors).
  expected<void> allreduce(std::uint64_t seq, tensor_view t, reduce_op op, const cpu_reduce_fn& fn,
                           std::size_t divisor, clock::time_point deadline);
  /// Broadcast from member `root` in place. Returns on every member (the root included)
  /// once every member has the data, so that every member learns of a disagreement. From
  /// broadcast_once_from() the data is copied once instead of twice through a slot: every other
  /// member reads the root's tensor from its memory (process_vm_readv) when every member can, or
  /// else, when the group has its pipes, the root splices the tensor's pages into a pipe
  /// to each, which reads them into its tensor.
  expected<void> broadcast(std::uint64_t seq, tensor_view t, int root, clock::time_point deadline);
  /// Member r's `in` lands in block r of `out` on every member. From 32 to 192 KiB per
  /// member, when the members can all run at once, an allgather may instead copy the
  /// others' inputs once, from where they lie: each member splices its input's pages into
  /// a pipe to every other (vmsplice), which reads them into its output; without the
  /// pipes, when every member could read the others' memory (open() tries), each reads
  /// them (process_vm_readv). One copy of each block instead of two through a slot;
  /// every member then returns only once every other one has read its input. That is
  /// faster while the inputs sit in the caches and slower when they were just written or
  /// evicted (shared_memory_single_copy.cpp), so by default (single_copy_mode::measured)
  /// the members time both ways on their own operations and take the faster one.
  expected<void> allgather(std::uint64_t seq, tensor_view in, tensor_view out,
                           clock::time_point deadline);
  /// Block r of the members' `in` (each `out.numel` elements), folded in rank order, lands
  /// in member r's `out`: the same bits as block r of an allreduce, in one synchronization
  /// per chunk instead of two and without the allreduce's copy back. `out` must not
  /// overlap `in`, except as exactly this member's block of it (in place). avg is the
  /// caller's division afterwards.
  expected<void> reduce_scatter(std::uint64_t seq, tensor_view in, tensor_view out, reduce_op op,
                                const cpu_reduce_fn& fn, clock::time_point deadline);
  /// Returns once every member called it.
  expected<void> barrier(std::uint64_t seq, clock::time_point deadline);

  /// Tells every member that this one failed: their waits fail at once. Idempotent.
  void mark_failed() noexcept;
  /// Makes this member's current and later waits fail with errc::aborted (shutdown).
  /// Safe from any thread.
  void abort() noexcept;

  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Whether allgathers may read the others' blocks from their memory (see allgather()):
  /// known once this member ran an allgather of those sizes, false before.
  bool reads_members_memory() const noexcept { return single_copy_ >= 1; }
  /// Whether those allgathers hand the blocks over through pipes (vmsplice) rather than
  /// process_vm_readv: known once open() returned.
  bool hands_over_through_pipes() const noexcept { return use_pipes_; }
  /// How many operations this member copied once so far: allgathers that took the others'
  /// blocks from their memory or pipes or wrote its own into their outputs, and broadcasts
  /// it received by reading the root's memory or through the pipes.
  std::uint64_t single_copy_reads() const noexcept { return single_copy_reads_; }
  /// From how many bytes broadcasts of ordinary buffers among members that all run at once
  /// copy once: 16 KiB where rank 0 measured reading another process's memory to be cheap,
  /// else 256 KiB (smaller ones stream through a ring of four pieces).
  std::size_t broadcast_once_from() const noexcept { return broadcast_once_from_; }
  /// The same for buffers that every member's last broadcast of these sizes found in shared
  /// host memory (copied through the mappings): 16 or 64 KiB.
  std::size_t shared_broadcast_once_from() const noexcept { return shared_broadcast_once_from_; }
  /// How many of those copies went through a mapping of the other member's shared host
  /// buffer (shared_host_memory.hpp) rather than a system call, one per member copied
  /// from or into; and how many such buffers this member mapped so far.
  std::uint64_t mapped_copies() const noexcept { return mapped_copies_; }
  std::uint64_t buffers_mapped() const noexcept { return peers_.mapped_total(); }
  std::size_t buffers_mapped_now() const noexcept { return peers_.mapped_now(); }

 private:
  struct header;
  struct member;
  struct op_desc;
  // The measured choice between the slots and reading the others' memory, per size class
  // (shared_memory_single_copy.cpp). The same on every member: every member runs the same
  // allgathers, and the choice changes only on figures they all exchanged.
  struct single_copy_tuner {
    bool read = false;           // the path taken, except while exploring
    bool switched = false;       // whether the last exchange switched (no exploring then)
    std::uint32_t cycle = 0;     // allgathers between exchanges (0: none yet)
    std::uint32_t position = 0;  // this allgather's place in the cycle
    // The best times of each way (the slots, then reading) this cycle, in ns: of the
    // allgather alone, and from its start to the next one's of the class.
    struct times {
      std::uint32_t op = ~std::uint32_t{0};
      std::uint32_t period = ~std::uint32_t{0};
    } best[2];
    int sampling = -1;  // the way of the last sample, until the next allgather starts
    clock::time_point sample_start;
    // Whether every member's input of the class's last allgather lay in a shared host
    // buffer (their descriptions say: all_shared()); the next one, if it reads,
    // then reads the others' inputs through mappings rather than the pipes.
    bool all_shared = false;
  };
  segment() = default;

  // Defined in shm_layout.hpp (inline: the waits call them on every poll).
  inline header& head() const noexcept;
  inline member& at(int r) const noexcept;
  inline std::byte* slot(int r, std::uint64_t chunk) const noexcept;
  // The world rank of member r, and the running operation as errors describe it.
  int world(int r) const;
  std::string what() const;

  // Maps `fd` with `slot_bytes` per slot; rank 0 creates the segment `name`, the others
  // attach to the one offered. Each returns "" or why not.
  std::string map(int fd, std::size_t slot_bytes);
  std::string create(const std::string& name, std::uint64_t token, std::size_t slot_bytes);
  std::string attach(const std::string& name, std::uint64_t token);

  // The steps of an operation return false once they failed, with the error in failure_
  // (fail() records it, failed() hands it out): a bool keeps the waits' hot path as short
  // as it was when failures were thrown; each operation returns an expected<void>.
  [[nodiscard]] bool begin(std::uint64_t seq, std::uint32_t kind, std::uint64_t bytes,
                           std::uint32_t detail);
  void publish() noexcept;
  // Records the CPU this member runs on in its line when it changed; whether a member that
  // wait() waits for (waiting_) last began an operation on the same CPU.
  void note_cpu() noexcept;
  bool shares_cpu_with_waited() noexcept;
  // Wakes the members asleep in wait() after this member's publishes (see
  // shared_memory_wait.cpp).
  void settle() noexcept;
  // Waits until every other member's phase (wait_one: member r's) reaches `target`; on
  // timeout the error says the late members `step` ("did not contribute") in time. On
  // the first such wait of an operation (`agree`), checks that those members run the same
  // operation as this one.
  [[nodiscard]] bool wait_all(std::uint64_t target, clock::time_point deadline, const char* step,
                              bool agree = true);
  [[nodiscard]] bool wait_one(int r, std::uint64_t target, clock::time_point deadline,
                              const char* step);
  template <class Missing>
  [[nodiscard]] bool wait(Missing&& missing, clock::time_point deadline, const char* step);
  // What member r described for the running operation (see shm_layout.hpp).
  struct described {
    std::uint64_t seq;
    std::uint32_t kind;
    std::uint64_t bytes;
    std::uint32_t detail;
  };
  described read_desc(int r) const;
  [[nodiscard]] bool check_agreement(int r);
  // A whole broadcast, chunk by chunk through the root's slot, with no wait after the
  // last chunk (shared_memory.cpp says why that keeps the agreement check); false once it
  // failed, as the waits.
  [[nodiscard]] bool broadcast_slots(std::byte* data, std::size_t bytes, int root,
                                     clock::time_point deadline);
  // A broadcast streamed through a ring at the start of the root's buffer (see
  // ring_max_bytes in shared_memory.cpp); false once it failed, as the waits.
  [[nodiscard]] bool broadcast_ring(std::byte* data, std::size_t bytes, int root,
                                    clock::time_point deadline);
  // Whether this member can read every other member's memory (process_vm_readv): set in
  // open(), published in its member line.
  bool probe_single_copy() const;
  // The pipes of single-copy allgathers, one per ordered pair of members, FIFOs named
  // after the segment (shared_memory_pipes.cpp). Rank 0 makes them with the segment
  // (make_pipes: "" or why not); every member opens the ones it writes to and reads from
  // before it answers the offer (open_pipes), and unlinks their names with the segment's
  // (unlink_pipes); once all answered, the members use them when every one opened its
  // pipes and each can hold the largest block (agree_on_pipes, the same on every member).
  std::string make_pipes(const std::string& name);
  void open_pipes(const std::string& name);
  void unlink_pipes(const std::string& name) const;
  // Unlinks the segment's name and, when this member mapped it and rank 0 made them, its
  // pipes' names.
  void unlink_names(const std::string& name) const;
  void agree_on_pipes();
  void close_pipes() noexcept;
  // The capacity each pipe is given: the largest single-copy block on pages of its own.
  static std::size_t pipe_bytes_wanted();
  // Splices `own` into the pipe to every other member; reads every other member's block
  // from its pipe into `dst`. False once they failed (the segment is then failed).
  [[nodiscard]] bool splice_own(const std::byte* own, std::size_t bytes);
  [[nodiscard]] bool read_pipes(std::size_t bytes, std::byte* dst);
  // Splices `bytes` at `from` into the pipe to member r; reads `bytes` from member r's pipe
  // into `to`. False once they failed (the segment is then failed).
  [[nodiscard]] bool splice_to(int r, const std::byte* from, std::size_t bytes);
  [[nodiscard]] bool read_pipe(int r, std::byte* to, std::size_t bytes);
  // A broadcast through the pipes, in pieces (shared_memory_pipes.cpp); false once it
  // failed, as the waits.
  [[nodiscard]] bool broadcast_pipes(std::byte* data, std::size_t bytes, int root,
                                     clock::time_point deadline);
  // Reads every other member's block from its memory (process_vm_readv) into `dst`; reads
  // `bytes` from member r's memory `at_offset` past where its `source` says into `to`.
  // False once they failed (the segment is then failed).
  [[nodiscard]] bool read_memory(std::size_t bytes, std::byte* dst);
  [[nodiscard]] bool read_from(int r, std::byte* to, std::size_t bytes, std::size_t at_offset);
  // Says where this member's data for the running single-copy operation lies (`source`,
  // and `region`, the shared host buffer holding it, if one does), before the publish.
  void say_source(const std::byte* p, const std::optional<shared_region>& region) noexcept;
  // Copies `bytes` between `mine` and member r's memory `at_offset` past its `source`: from
  // there, or there when `write`. With plain copies when that range lies in a shared host
  // buffer of r's that this member could map (peers_), else with process_vm_readv or
  // process_vm_writev. False once it failed (the segment is then failed).
  [[nodiscard]] bool cross_copy(int r, std::byte* mine, std::size_t bytes, std::size_t at_offset,
                                bool write);
  // At the first broadcast that may read the root's memory: learns from the members' flags
  // whether every one can (all_read_), after a publish and a wait for every member; false
  // once it failed, as the waits.
  [[nodiscard]] bool learn_readers(clock::time_point deadline);
  // A broadcast whose members copy the root's tensor straight from its memory
  // (process_vm_readv, process_vm_writev); an allgather whose members write their blocks
  // into the others' outputs (process_vm_writev). False once they failed, as the waits.
  // `region`: the shared host buffer holding `data`, if any.
  [[nodiscard]] bool broadcast_read(std::byte* data, std::size_t bytes, int root,
                                    const std::optional<shared_region>& region,
                                    clock::time_point deadline);
  // `region`: the shared host buffer holding the output `dst`, if any.
  [[nodiscard]] bool allgather_write(const std::byte* own, std::size_t bytes, std::byte* dst,
                                     const std::optional<shared_region>& region,
                                     clock::time_point deadline);
  // The single-copy allgather (see allgather(); shared_memory_single_copy.cpp) of `own`,
  // this member's block, into `dst`: read when it read every other member's block, failed
  // as the waits fail, slots when the caller is to copy the blocks through the slots (the
  // size, the CPUs or a member's permissions do not allow it).
  enum class single_copy_outcome { read, failed, slots };
  // `own_region`: the shared host buffer holding `own`, if one does (the caller looked).
  [[nodiscard]] single_copy_outcome allgather_single_copy(
      const std::byte* own, std::size_t bytes, const std::optional<shared_region>& own_region,
      std::byte* dst, clock::time_point deadline);
  // Reads every other member's block into `dst`, from its pipe (`through_pipes`) or its
  // memory, and waits until every member read this one's; false once it failed, as the
  // waits.
  [[nodiscard]] bool read_members(const std::byte* own, std::size_t bytes, std::byte* dst,
                                  clock::time_point deadline, bool through_pipes);
  // Whether an allgather of `bytes` per member is of the sizes the tuners measure, and
  // which tuner's (shared_memory_single_copy.cpp).
  static bool in_single_copy_range(std::size_t bytes) noexcept;
  static std::size_t size_class(std::size_t bytes) noexcept;
  // After the first wait of an allgather or a broadcast: whether every member said that
  // its buffer lies in a shared host buffer (shm_layout::buffer_shared; see
  // single_copy_tuner::all_shared, shared_broadcasts_ and shared_allgathers_).
  bool all_shared() const;
  // After the first wait of a broadcast through the slots, and the last of the others:
  // notes all_shared() for the next broadcast when this one is of the sizes copied once
  // with shared buffers, from shared_broadcast_once_from_ (512 KiB among members that outnumber
  // the CPUs; shared_memory.cpp).
  void note_shared_broadcast(std::size_t bytes);
  // From how many bytes ordinary buffers are copied once among members that all run at
  // once, given rank 0's `measured` threshold: the same where reading is cheap, else the
  // ring's largest size (shared_memory.cpp).
  static std::size_t ordinary_broadcast_once_from(std::size_t measured) noexcept;
  // After the first wait of an allgather: the same for the allgathers that such members
  // write into the others' outputs when all are shared (shared_allgathers_).
  void note_shared_allgather(std::size_t bytes);
  // At a tuner's exchange: decides its next cycle from every member's figures.
  void retune(single_copy_tuner& t);
  // At the end of an allgather that is a tuner's sample (timing_): records its time.
  void note_sample() noexcept;
  bool alive(int r) const;
  void wake_all() noexcept;
  bool fail(troupe::error e);
  expected<void> failed();

  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::size_t slot_bytes_ = 0;
  std::size_t data_offset_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  // Whether the members' pids (in their member lines) can be checked: they share a pid
  // namespace.
  bool check_liveness_ = false;
  // Whether the members can all run at once (not more than the CPUs rank 0 may run on;
  // the same on every member, from the segment's header): waits spin before yielding,
  // small broadcasts stream through a ring, allreduces up to 4 MiB in larger chunks.
  bool run_at_once_ = false;
  // From how many bytes broadcasts copy once when run_at_once_: buffers all shared from
  // rank 0's measure (the header's; see shared_memory.cpp), ordinary ones from what
  // ordinary_broadcast_once_from() makes of it.
  std::size_t shared_broadcast_once_from_ = 64 << 10;
  std::size_t broadcast_once_from_ = 256 << 10;
  // Whether allgathers may read the others' memory (their single_copy flags): -1 until
  // this member first needs to know, after it has seen every member publish (the flags
  // are written before a member's first publish); 0 never, 1 always, 2 when measured to
  // be faster (the tuners below).
  int single_copy_ = -1;
  // The pipes' file descriptors by member (-1 for this one, and when not in use), and
  // whether single-copy allgathers go through them (agree_on_pipes()).
  std::vector<int> pipe_to_, pipe_from_;
  bool use_pipes_ = false;
  std::uint64_t single_copy_reads_ = 0;
  std::uint64_t mapped_copies_ = 0;
  peer_regions peers_;  // the others' shared host buffers mapped here
  // Whether every member can read the others' memory (their flags' reads_memory bit): -1
  // until the first broadcast that needs to know (learn_readers()), then 0 or 1.
  int all_read_ = -1;
  // Whether every member's buffer of the last broadcast from shared_broadcast_once_from_ (512 KiB
  // among members that outnumber the CPUs) lay in a shared host buffer
  // (note_shared_broadcast()): the next such broadcast is then copied once, through the
  // mappings, at sizes where ordinary buffers go through the ring or the slots. The same
  // on every member, noted from the descriptions all read.
  bool shared_broadcasts_ = false;
  // The same for the outputs of allgathers from 256 KiB per member: the next such
  // allgather then writes the members' blocks into the others' outputs.
  bool shared_allgathers_ = false;
  single_copy_tuner tuners_[3];
  single_copy_tuner* timing_ = nullptr;  // the running allgather's, when it is a sample

  std::uint64_t phase_ = 0;   // what this member published last
  bool wake_due_ = false;     // published since the last settle()
  std::uint32_t cpu_ = 0;     // what note_cpu() last stored (the CPU plus one)
  std::uint64_t chunks_ = 0;  // chunks run so far: chunk c uses buffer c % 2 of each slot
  // Buffer b of this member's slot may be rewritten once every member's phase reached
  // guard_[b]: the others have then finished reading it. A member finishes reading an
  // operation's slots before it publishes anything in the next one, so an operation that
  // ends with reading sets guard_ to its phase + 1 (the others' first publish after it)
  // rather than publishing once more only to say it is done: one publish, and one line
  // passed between the members, fewer per chunk.
  std::uint64_t guard_[2] = {0, 0};
  // The running operation, for agreement checks and errors.
  std::uint64_t seq_ = 0;
  std::uint64_t ops_ = 0;    // operations begun on this segment
  std::size_t desc_at_ = 0;  // where the running one's description is (begin())
  std::uint32_t kind_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint32_t detail_ = 0;
  bool agreed_ = false;
  // The members a wait still waits for (wait()), kept so that a wait that does not end at
  // its first look does not allocate.
  std::vector<int> waiting_;
  troupe::error failure_;  // why the running operation failed (fail() sets it)
  std::atomic<bool> aborted_{false};
};

}  // namespace troupe::collectives::gloo_shm
