// Why this file is long (~720 lines): the segment's layout, its waits (spin, yield, then
// futex) and the collectives over its slots share one set of invariants about who writes
// which slot when; they are kept in one file so that those invariants are read in one
// place.
#include <troupe/collectives/gloo/shared_memory.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <thread>

#include <troupe/collectives/gloo/blocks.hpp>
#include <troupe/collectives/gloo/shm_names.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

constexpr std::uint64_t layout_magic = 0x74726f7570652d73;  // "troupe-s"
constexpr std::uint32_t layout_version = 2;
constexpr std::size_t page = 4096;
constexpr std::size_t descs = 4;  // operations a member can be ahead of another, and more

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

// Broadcasts up to this size go in pieces of broadcast_piece_bytes: the others copy a
// piece out while the root copies the next one in. World 2 on 2 cores, alternating runs:
// 16 KiB 0.70x the time of one whole slot, 64 KiB 0.85x; but 256 KiB took 1.1x and 1 MiB
// 2.3-2.8x in pieces of 8 or 32 KiB, where one whole slot is copied out while it is still
// in cache. Only when the members are not more than the CPUs: at 4 members on 2 cores the
// root and the others take turns on a CPU, and 64 KiB in pieces took 1.6x the time
// (bench/RESULTS.md).
constexpr std::size_t broadcast_pieces_max_bytes = 64 << 10;
constexpr std::size_t broadcast_piece_bytes = 8 << 10;

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
// What a member that holds up the reuse of a buffer did not do.
constexpr const char* reuse_step = "did not finish reading an earlier chunk";
// How often a sleeping waiter wakes to check that the members it waits for are alive.
constexpr auto liveness_period = std::chrono::milliseconds(20);

// The CPUs this process may run on (its affinity mask, which a container's cpuset
// limits), at least 1.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  // More CPUs than a cpu_set_t holds (1024): the machine's count.
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

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

std::string errno_text(int e) { return std::strerror(e); }

using gloo_blocks::block;

std::string describe_op(std::uint32_t kind, std::uint64_t bytes, std::uint32_t detail) {
  switch (kind) {
    case op_allreduce:
      return strcat("allreduce of ", bytes, " bytes (", to_string(static_cast<dtype>(detail >> 8)),
                    ", ", to_string(static_cast<reduce_op>(detail & 0xff)), ")");
    case op_broadcast:
      return strcat("broadcast of ", bytes, " bytes from rank ", detail);
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
  std::atomic<std::int32_t> failed_by;          // 0, or the failed member's rank + 1
  alignas(64) std::atomic<std::uint32_t> wake;  // futex word, bumped by every publish
  std::atomic<std::uint32_t> sleepers;
};

struct segment::op_desc {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> bytes;
  std::atomic<std::uint32_t> kind;
  std::atomic<std::uint32_t> detail;
};

struct alignas(64) segment::member {
  std::atomic<std::uint64_t> phase;
  alignas(64) std::atomic<std::int64_t> pid;
  std::atomic<std::uint64_t> start;
  std::atomic<std::uint64_t> pid_ns;
  op_desc desc[descs];
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

void apply_env(open_options& o) {
  if (auto v = settings::gloo_shm.value(); v && *v == "0") o.enabled = false;
  if (auto v = settings::gloo_shm_slot.value()) {
    std::size_t n = 0;
    std::string_view s(*v);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec != std::errc() || p != s.data() + s.size() || n == 0 || n > (std::size_t{1} << 30))
      TROUPE_LOG(log_level::warn, "collectives", settings::gloo_shm_slot.variable, "='", s,
                 "' is not a byte count between 1 and 1 GiB; using the default ",
                 default_slot_bytes);
    else
      o.slot_bytes = n;
  }
}

segment::header& segment::head() const noexcept { return *static_cast<header*>(map_); }

segment::member& segment::at(int r) const noexcept {
  auto* base = static_cast<std::byte*>(map_) + round_up(sizeof(header), 64);
  return reinterpret_cast<member*>(base)[r];
}

std::byte* segment::slot(int r, std::uint64_t chunk) const noexcept {
  return static_cast<std::byte*>(map_) + data_offset_ +
         (2 * static_cast<std::size_t>(r) + (chunk & 1)) * slot_bytes_;
}

std::string segment::map(int fd, std::size_t slot_bytes) {
  slot_bytes_ = slot_bytes;
  map_bytes_ = data_offset_ + 2 * static_cast<std::size_t>(size_) * slot_bytes;
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return strcat("mmap of ", map_bytes_, " bytes: ", errno_text(errno));
  map_ = p;
  return "";
}

std::string segment::create(const std::string& name, std::uint64_t token, std::size_t slot_bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return strcat("shm_open(", name, "): ", errno_text(errno));
  const std::size_t bytes = data_offset_ + 2 * static_cast<std::size_t>(size_) * slot_bytes;
  // Reserve the pages now: a full /dev/shm must fail here, not as SIGBUS later.
  std::string why;
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0)
    why = strcat("reserving ", bytes, " bytes in /dev/shm: ", errno_text(e));
  else
    why = map(fd, slot_bytes);
  ::close(fd);
  if (!why.empty()) {
    ::shm_unlink(name.c_str());
    return why;
  }
  auto& h = head();
  new (&h) header{};
  h.magic = layout_magic;
  h.version = layout_version;
  h.members = static_cast<std::uint32_t>(size_);
  h.slot_bytes = slot_bytes;
  h.token = token;
  h.run_at_once = size_ <= usable_cpus() ? 1 : 0;
  for (int r = 0; r < size_; ++r) new (&at(r)) member{};
  return "";
}

std::string segment::attach(const std::string& name, std::uint64_t token) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0)
    return strcat("shm_open(", name, "): ", errno_text(errno),
                  " (another host, or another IPC namespace)");
  std::string why;
  struct stat st {};
  header probe;  // the slot size, read before mapping the whole segment
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(data_offset_))
    why = "the segment is smaller than its header";
  else if (::pread(fd, &probe, sizeof(probe), 0) != static_cast<ssize_t>(sizeof(probe)))
    why = "could not read the segment's header";
  else if (probe.magic != layout_magic || probe.version != layout_version || probe.token != token ||
           probe.members != static_cast<std::uint32_t>(size_))
    why = "the segment's header does not match the offer";
  else if (static_cast<std::size_t>(st.st_size) <
           data_offset_ + 2 * static_cast<std::size_t>(size_) * probe.slot_bytes)
    why = "the segment is smaller than its slots";
  else
    why = map(fd, probe.slot_bytes);
  ::close(fd);
  return why;
}

expected<std::unique_ptr<segment>> segment::open(store& s, const open_options& o) {
  if (o.size <= 1) return std::unique_ptr<segment>();
  auto seg = std::unique_ptr<segment>(new segment());
  seg->rank_ = o.rank;
  seg->size_ = o.size;
  seg->world_ranks_ = o.world_ranks;
  if (seg->world_ranks_.empty())
    for (int r = 0; r < o.size; ++r) seg->world_ranks_.push_back(r);
  seg->data_offset_ = round_up(round_up(sizeof(header), 64) + sizeof(member) * o.size, page);
  const auto dl = deadline::after(o.timeout);

  // Rank 0 offers "<name> <token>" or "none <why>"; every member answers "1" or "0 <why>".
  std::string my_answer = "1";
  std::string name;
  if (o.rank == 0) {
    std::random_device rd;
    const std::uint64_t token =
        (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
    // Names left by a rank 0 killed while its group was being created go first.
    sweep_dead_segments();
    name = segment_name(token);
    std::string why =
        !o.enabled
            ? "TROUPE_GLOO_SHM=0"
            : seg->create(name, token, round_up(std::max<std::size_t>(o.slot_bytes, 1), page));
    std::string offer = why.empty() ? strcat(name, " ", token_hex(token)) : "none " + why;
    if (!why.empty()) my_answer = "0 " + why;
    auto set = s.set("offer", std::as_bytes(std::span(offer.data(), offer.size())), dl.remaining());
    if (!set) {
      if (seg->map_) ::shm_unlink(name.c_str());
      return std::move(set).error();
    }
  } else {
    auto got = s.get("offer", dl.remaining());
    if (!got) return std::move(got).error();
    std::string offer(reinterpret_cast<const char*>(got->data()), got->size());
    if (offer.rfind("none ", 0) == 0) {
      my_answer = "0 rank 0 offered no segment (" + offer.substr(5) + ")";
    } else if (!o.enabled) {
      my_answer = "0 TROUPE_GLOO_SHM=0";
    } else {
      auto space = offer.find(' ');
      name = offer.substr(0, space);
      std::uint64_t token = 0;
      if (space != std::string::npos)
        std::from_chars(offer.data() + space + 1, offer.data() + offer.size(), token, 16);
      if (auto why = seg->attach(name, token); !why.empty()) my_answer = "0 " + why;
    }
  }

  if (seg->map_ && my_answer == "1") {
    auto& me = seg->at(o.rank);
    me.pid.store(::getpid());
    auto ps = read_proc(::getpid());
    me.start.store(ps ? ps->start : 0);
    me.pid_ns.store(pid_namespace());
  }
  auto answer_key = strcat("joined/", o.rank);
  auto set = s.set(answer_key, std::as_bytes(std::span(my_answer.data(), my_answer.size())),
                   dl.remaining());
  std::vector<std::string> keys;
  for (int r = 0; r < o.size; ++r) keys.push_back(strcat("joined/", r));
  expected<void> waited =
      set ? s.wait(keys, dl.remaining()) : expected<void>(std::move(set).error());
  // Every member that knows the name removes it once everyone answered (or failed to):
  // the members keep their mappings, and no name outlives the group's creation, even when
  // rank 0 was killed while it waited (ENOENT from the others is expected and harmless).
  if (!name.empty()) ::shm_unlink(name.c_str());
  if (!waited) return std::move(waited).error();

  std::string refusal;
  for (int r = 0; r < o.size && refusal.empty(); ++r) {
    auto v = s.get(keys[static_cast<std::size_t>(r)], dl.remaining());
    if (!v) return std::move(v).error();
    std::string a(reinterpret_cast<const char*>(v->data()), v->size());
    if (a != "1") refusal = strcat("rank ", seg->world(r), ": ", a.size() > 2 ? a.substr(2) : a);
  }
  if (!refusal.empty()) {
    // Every member knows why; one says it.
    TROUPE_LOG(o.rank == 0 ? log_level::info : log_level::debug, "collectives", o.group,
               " runs its collectives over TCP only, without shared memory: ", refusal);
    return std::unique_ptr<segment>();
  }

  seg->run_at_once_ = seg->head().run_at_once != 0;
  const auto my_ns = seg->at(o.rank).pid_ns.load();
  seg->check_liveness_ = my_ns != 0;
  for (int r = 0; r < o.size; ++r)
    seg->check_liveness_ = seg->check_liveness_ && seg->at(r).pid_ns.load() == my_ns;
  TROUPE_LOG(log_level::debug, "collectives", o.group, " shares memory between its ", o.size,
             " members (", seg->slot_bytes_, " bytes per slot)");
  return seg;
}

segment::~segment() {
  if (map_) ::munmap(map_, map_bytes_);
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
  seq_ = seq;
  kind_ = kind;
  bytes_ = bytes;
  detail_ = detail;
  agreed_ = false;
  auto& d = at(rank_).desc[seq % descs];
  d.bytes.store(bytes, std::memory_order_relaxed);
  d.kind.store(kind, std::memory_order_relaxed);
  d.detail.store(detail, std::memory_order_relaxed);
  // Published by the next phase store, and by this release for members that compare
  // while they wait for this one (see wait()).
  d.seq.store(seq, std::memory_order_release);
  return true;
}

void segment::publish() noexcept {
  auto& h = head();
  // Sequentially consistent, as the sleeper's side in wait(): either a sleeper that counted
  // itself sees this phase when it checks once more, or this sees the count and wakes it.
  // Nobody sleeping (the usual case), the futex word is left alone: no line that every
  // member writes on every step.
  at(rank_).phase.store(++phase_);
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

bool segment::check_agreement(int r) {
  auto& d = at(r).desc[seq_ % descs];
  const auto seq = d.seq.load(std::memory_order_acquire);
  const auto kind = d.kind.load(std::memory_order_relaxed);
  const auto bytes = d.bytes.load(std::memory_order_relaxed);
  const auto detail = d.detail.load(std::memory_order_relaxed);
  if (seq == seq_ && kind == kind_ && bytes == bytes_ && detail == detail_) return true;
  mark_failed();
  return fail(make_error(errc::invalid_argument, "the members disagree on collective #", seq_,
                         ": rank ", world(rank_), " (this one) runs ", what(), ", rank ", world(r),
                         seq == seq_ ? strcat(" runs ", describe_op(kind, bytes, detail))
                                     : strcat(" is at collective #", seq),
                         "; every member must call the same collectives with the same sizes, "
                         "dtypes, reductions and roots, in the same order"));
}

template <class Missing>
bool segment::wait(Missing&& missing, clock::time_point deadline, const char* step) {
  auto& h = head();
  // Compares with member r if it started this collective: whether or not it got as far
  // as this member waits for.
  auto compare_if_started = [&](int r) {
    auto& d = at(r).desc[seq_ % descs];
    if (d.seq.load(std::memory_order_acquire) == seq_ &&
        d.kind.load(std::memory_order_relaxed) != 0)
      return check_agreement(r);
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
  std::vector<int> waiting;
  auto done = [&] {
    waiting.clear();
    missing(waiting);
    return waiting.empty();
  };
  if (done()) return true;
  const auto start = clock::now();
  if (run_at_once_) {
    do {
      for (int i = 0; i < 16; ++i) {
        cpu_relax();
        if (done()) return true;
      }
    } while (clock::now() - start < spin_time);
  }
  do {
    ::sched_yield();
    if (done()) return true;
  } while (clock::now() - start < yield_time);
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

expected<void> segment::allreduce(std::uint64_t seq, tensor_view t, reduce_op op,
                                  const cpu_reduce_fn& fn, std::size_t divisor,
                                  clock::time_point deadline) {
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
      publish();
      guard_[c & 1] = phase_;
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
    publish();
    guard_[c & 1] = phase_;
  }
  return ok();
}

expected<void> segment::broadcast(std::uint64_t seq, tensor_view t, int root,
                                  clock::time_point deadline) {
  if (!begin(seq, op_broadcast, t.nbytes(), static_cast<std::uint32_t>(root))) return failed();
  auto* data = static_cast<std::byte*>(t.data);
  const std::size_t bytes = t.nbytes();
  // Small broadcasts go in pieces when every member has a CPU, so that the others copy
  // one piece out while the root copies the next in; otherwise whole slots (see
  // broadcast_piece_bytes).
  const std::size_t piece = bytes <= broadcast_pieces_max_bytes && run_at_once_
                                ? std::min(slot_bytes_, broadcast_piece_bytes)
                                : slot_bytes_;
  for (std::size_t off = 0; off < bytes; off += piece) {
    const std::size_t len = std::min(piece, bytes - off);
    const std::uint64_t c = chunks_++;
    if (rank_ == root) {
      if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return failed();
      std::memcpy(slot(rank_, c), data + off, len);
      publish();
      // The others publish the same phase once they copied the chunk out.
      guard_[c & 1] = phase_;
    } else {
      if (!wait_one(root, phase_ + 1, deadline, "did not write the data")) return failed();
      std::memcpy(data + off, slot(root, c), len);
      publish();
    }
  }
  // Every member waits until every other one has its data, and compares what each was
  // asked to do: otherwise a root would return at once, never learning that the others
  // took another member for the root or another size, and the members would go on with
  // different data.
  if (bytes == 0) return ok();
  agreed_ = false;
  return wait_all(phase_, deadline, "did not read the data") ? ok() : failed();
}

expected<void> segment::allgather(std::uint64_t seq, tensor_view in, tensor_view out,
                                  clock::time_point deadline) {
  const std::size_t bytes = in.nbytes();
  if (!begin(seq, op_allgather, bytes, 0)) return failed();
  auto* dst = static_cast<std::byte*>(out.data);
  const auto* src = static_cast<const std::byte*>(in.data);
  auto block_of = [&](int r) { return dst + bytes * static_cast<std::size_t>(r); };
  if (block_of(rank_) != src) std::memmove(block_of(rank_), src, bytes);
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t len = std::min(slot_bytes_, bytes - off);
    const std::uint64_t c = chunks_++;
    if (!wait_all(guard_[c & 1], deadline, reuse_step, false)) return failed();
    std::memcpy(slot(rank_, c), block_of(rank_) + off, len);
    publish();
    if (!wait_all(phase_, deadline, "did not contribute")) return failed();
    for (int r = 0; r < size_; ++r)
      if (r != rank_) std::memcpy(block_of(r) + off, slot(r, c), len);
    publish();
    guard_[c & 1] = phase_;
  }
  return ok();
}

expected<void> segment::reduce_scatter(std::uint64_t seq, tensor_view in, tensor_view out,
                                       reduce_op op, const cpu_reduce_fn& fn,
                                       clock::time_point deadline) {
  const std::size_t es = element_size(in.type);
  if (!begin(seq, op_reduce_scatter, in.nbytes(),
             (static_cast<std::uint32_t>(in.type) << 8) | static_cast<std::uint32_t>(op)))
    return failed();
  const auto members = static_cast<std::size_t>(size_);
  const std::size_t per_rank = out.numel;
  // Each chunk takes the same piece of every block: a member's slot holds its n pieces,
  // and member r folds piece r of every slot into its output.
  const std::size_t chunk_bytes = std::min(slot_bytes_, allreduce_chunk_bytes);
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
    publish();
    guard_[c & 1] = phase_;
  }
  return ok();
}

expected<void> segment::barrier(std::uint64_t seq, clock::time_point deadline) {
  if (!begin(seq, op_barrier, 0, 0)) return failed();
  publish();
  return wait_all(phase_, deadline, "did not arrive") ? ok() : failed();
}

}  // namespace troupe::collectives::gloo_shm
