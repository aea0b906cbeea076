// Creating, attaching and agreeing on a gloo group's shared-memory segment
// (shared_memory.hpp, "segment::open"); the waits and the collectives are in
// shared_memory.cpp, the layout both use in shm_layout.hpp.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/gloo/shm_layout.hpp>
#include <troupe/collectives/gloo/shm_names.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_shm {

namespace {

// The CPUs this process may run on (its affinity mask, which a container's cpuset
// limits), at least 1.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  // More CPUs than a cpu_set_t holds (1024): the machine's count.
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string errno_text(int e) { return std::strerror(e); }

// Yama's ptrace scope, 0 where the kernel has no Yama. From 1 up the kernel refuses reads
// between processes that are not parent and child, as the members of a group are not,
// and logs each refusal.
int yama_ptrace_scope() {
  std::FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (!f) return 0;
  int scope = 0;
  if (std::fscanf(f, "%d", &scope) != 1) scope = 0;
  std::fclose(f);
  return scope;
}

// From how many bytes broadcasts among members that all run at once copy the data once
// (see shared_memory.cpp): 16 KiB where reading 16 KiB of a process's memory with
// process_vm_readv takes under 1.5 us (0.8 us on a VM whose system calls cost 0.07 us,
// where the ring's handoffs at that size took 3.6 us), 64 KiB where it costs more (2.6 us
// on a VM whose system calls cost 1 us), and there only for buffers all in shared host
// memory: ordinary ones stream through the ring up to 256 KiB. Measured
// on this process's own memory: the best of 5 rounds of 8 reads, about 40 calls.
std::uint64_t measure_broadcast_once_from() {
  constexpr std::size_t probe = 16 << 10;
  constexpr std::uint64_t cheap_below_ns = 1500;
  std::vector<std::byte> from(probe, std::byte{1}), to(probe);
  iovec local{to.data(), probe};
  iovec remote{from.data(), probe};
  std::uint64_t best = ~std::uint64_t{0};
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 8; ++i)
      if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(probe))
        return 64 << 10;  // no reads here: the threshold does not matter
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    best = std::min(best, static_cast<std::uint64_t>(ns) / 8);
  }
  return best < cheap_below_ns ? probe : 64 << 10;
}

}  // namespace

void apply_env(open_options& o) {
  if (auto v = settings::gloo_shm.value(); v && *v == "0") o.enabled = false;
  if (auto v = settings::gloo_shm_single_copy.value()) {
    if (*v == "1" || *v == "on")
      o.single_copy = single_copy_mode::always;
    else if (*v == "0" || *v == "off")
      o.single_copy = single_copy_mode::off;
    else if (*v == "auto")
      o.single_copy = single_copy_mode::measured;
    else {
      o.single_copy = single_copy_mode::measured;
      TROUPE_LOG(log_level::warn, "collectives", settings::gloo_shm_single_copy.variable, "='", *v,
                 "' is none of 0, auto and 1; allgathers measure which way is faster (auto)");
    }
  }
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
  h.magic = shm_layout::magic;
  h.version = shm_layout::version;
  h.members = static_cast<std::uint32_t>(size_);
  h.slot_bytes = slot_bytes;
  h.token = token;
  h.run_at_once = size_ <= usable_cpus() ? 1 : 0;
  h.broadcast_once_from = measure_broadcast_once_from();
  static_assert(offsetof(member, pid) == 64, "the phase and the descriptions share one line");
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
  else if (probe.magic != shm_layout::magic || probe.version != shm_layout::version ||
           probe.token != token || probe.members != static_cast<std::uint32_t>(size_))
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
  // One member needs no segment; more than the descriptions can name do not fit one host.
  if (o.size <= 1 || o.size >= shm_layout::max_members) return std::unique_ptr<segment>();
  auto seg = std::unique_ptr<segment>(new segment());
  seg->rank_ = o.rank;
  seg->size_ = o.size;
  seg->world_ranks_ = o.world_ranks;
  if (seg->world_ranks_.empty())
    for (int r = 0; r < o.size; ++r) seg->world_ranks_.push_back(r);
  seg->data_offset_ = shm_layout::round_up(
      shm_layout::round_up(sizeof(header), 64) + sizeof(member) * o.size, shm_layout::page);
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
    std::string why = !o.enabled
                          ? "TROUPE_GLOO_SHM=0"
                          : seg->create(name, token,
                                        shm_layout::round_up(std::max<std::size_t>(o.slot_bytes, 1),
                                                             shm_layout::page));
    // The pipes of single-copy allgathers and of broadcasts.
    if (why.empty() && o.pipes && o.single_copy != single_copy_mode::off) {
      if (auto no_pipes = seg->make_pipes(name); no_pipes.empty())
        seg->head().pipes = 1;
      else
        TROUPE_LOG(log_level::debug, "collectives", o.group,
                   " hands its allgather blocks over without pipes: ", no_pipes);
    }
    std::string offer = why.empty() ? strcat(name, " ", token_hex(token)) : "none " + why;
    if (!why.empty()) my_answer = "0 " + why;
    auto set = s.set("offer", std::as_bytes(std::span(offer.data(), offer.size())), dl.remaining());
    if (!set) {
      if (seg->map_) seg->unlink_names(name);
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
    me.map_address.store(reinterpret_cast<std::uintptr_t>(seg->map_));
    // A member that copies through the slots only opens none: no member then uses them.
    if (seg->head().pipes && o.single_copy != single_copy_mode::off) seg->open_pipes(name);
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
  if (!name.empty()) seg->unlink_names(name);
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
  seg->shared_broadcast_once_from_ = static_cast<std::size_t>(seg->head().broadcast_once_from);
  seg->broadcast_once_from_ = ordinary_broadcast_once_from(seg->shared_broadcast_once_from_);
  seg->agree_on_pipes();
  const auto my_ns = seg->at(o.rank).pid_ns.load();
  seg->check_liveness_ = my_ns != 0;
  for (int r = 0; r < o.size; ++r)
    seg->check_liveness_ = seg->check_liveness_ && seg->at(r).pid_ns.load() == my_ns;
  // Before this member's first publish, which makes the flag visible to the others. Under
  // a Yama ptrace scope of 1 and up only a member told to always read tries to read the
  // others' memory (and the kernel logs its refusal), so that a default group leaves no
  // line in the kernel's log. With the pipes every member can take single-copy allgathers;
  // reading the others' memory also serves large broadcasts (see broadcast()).
  const bool reads = o.single_copy != single_copy_mode::off && o.reads && seg->check_liveness_ &&
                     (o.single_copy == single_copy_mode::always || yama_ptrace_scope() == 0) &&
                     seg->probe_single_copy();
  const bool single_copy = o.single_copy != single_copy_mode::off && (seg->use_pipes_ || reads);
  seg->at(o.rank).single_copy.store((!single_copy                                ? 2u
                                     : o.single_copy == single_copy_mode::always ? 1u
                                                                                 : 3u) |
                                    (reads ? shm_layout::reads_memory : 0u));
  TROUPE_LOG(log_level::debug, "collectives", o.group, " shares memory between its ", o.size,
             " members (", seg->slot_bytes_, " bytes per slot; allgathers ",
             !single_copy      ? "copy through the slots only"
             : seg->use_pipes_ ? "may hand blocks over through pipes"
                               : "may read the others' memory",
             ")");
  return seg;
}

void segment::unlink_names(const std::string& name) const {
  ::shm_unlink(name.c_str());
  if (map_ && head().pipes) unlink_pipes(name);
}

bool segment::probe_single_copy() const {
  // Reads the magic word at the start of each other member's mapping of the segment: the
  // kernel allows it when this process may trace that one (the same user, and no Yama
  // restriction or seccomp filter in the way).
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    std::uint64_t word = 0;
    iovec local{&word, sizeof(word)};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(at(r).map_address.load())),
                 sizeof(word)};
    const auto n =
        ::process_vm_readv(static_cast<pid_t>(at(r).pid.load()), &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(sizeof(word)) || word != shm_layout::magic) {
      TROUPE_LOG(log_level::debug, "collectives", "cannot read rank ", world(r), "'s memory (",
                 n < 0 ? errno_text(errno) : "a short or wrong read",
                 "); allgathers copy through shared memory");
      return false;
    }
  }
  return true;
}

segment::~segment() {
  close_pipes();
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace troupe::collectives::gloo_shm
