// Members of the gloo backend's shared-memory segment as threads of one test process,
// each opening the segment with its rank over one in-process store, and the operations
// they run with their expected results. Small slots (4 KiB) split the tensors into many
// chunks, so that both buffers of every slot and the guards between them are used.
#pragma once

#include <doctest/doctest.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <latch>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/shared_host_memory.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/store/memory_store.hpp>
#include "op_suite.hpp"
#include "thread_ranks.hpp"

namespace troupe::collectives::testing::shm {

using namespace std::chrono_literals;
using troupe::collectives::gloo_shm::open_options;
using troupe::collectives::gloo_shm::segment;
using troupe::collectives::gloo_shm::single_copy_mode;
using troupe::collectives::testing::buffer;
using troupe::collectives::testing::check_all;

inline constexpr std::size_t small_slot = 4096;

struct setup {
  int members = 2;
  std::size_t slot_bytes = small_slot;
  std::vector<int> world_ranks;     // empty: the group ranks
  std::vector<int> disabled;        // members that turn shared memory off
  std::vector<int> no_single_copy;  // members that do not ask to read the others' memory
  // What the others ask for: to read the others' memory at every size where it may, so
  // that the tests know which way an allgather goes, unless a test measures.
  single_copy_mode single_copy = single_copy_mode::always;
  bool pipes = true;  // whether single-copy allgathers may go through pipes
  bool reads = true;  // whether the members may read the others' memory
  // Whether the members open the segment confined to one CPU, as if they outnumbered the
  // CPUs (the segment then takes them for members that cannot all run at once); they run
  // on all of this process's CPUs again once opened.
  bool one_cpu = false;
  duration timeout = 10s;

  setup with_slot(std::size_t bytes) const {
    auto s = *this;
    s.slot_bytes = bytes;
    return s;
  }
  setup without_shm(int rank) const {
    auto s = *this;
    s.disabled.push_back(rank);
    return s;
  }
  setup without_single_copy(int rank) const {
    auto s = *this;
    s.no_single_copy.push_back(rank);
    return s;
  }
  setup without_pipes() const {
    auto s = *this;
    s.pipes = false;
    return s;
  }
  setup without_reads() const {
    auto s = *this;
    s.reads = false;
    return s;
  }
  setup on_one_cpu() const {
    auto s = *this;
    s.one_cpu = true;
    return s;
  }
  setup with_single_copy(single_copy_mode mode) const {
    auto s = *this;
    s.single_copy = mode;
    return s;
  }
};

inline setup group_of(int members, std::vector<int> world_ranks = {}) {
  setup s;
  s.members = members;
  s.world_ranks = std::move(world_ranks);
  return s;
}

// What a member sees of the others while its body runs.
struct member {
  int rank;
  int size;
  segment& seg;
  const std::vector<segment*>& all;  // every member's segment, alive until all bodies end
};

// A member's body reads as a sequence of operations: the first that fails ends it, and
// on_members reports that failure as "threw <errc>: <message>".
inline void must(expected<void> r) {
  if (!r) throw troupe::exception(std::move(r).error());
}

inline std::string describe_throw(const troupe::exception& e) {
  return strcat("threw ", to_string(e.code()), ": ", e.err().message());
}

// Opens one segment per member, each on its own thread over one memory_store, then runs
// `body(member&)` on every member's thread once all of them opened. Returns what each body
// returned ("" for success), "no segment", "open: <error>", or "threw <errc>: <message>".
// Segments are destroyed only after every body returned.
template <class F>
std::vector<std::string> on_members(const setup& s, F body) {
  memory_store store;
  const auto n = static_cast<std::size_t>(s.members);
  std::vector<std::string> out(n);
  std::vector<segment*> all(n, nullptr);
  std::latch opened(s.members), finished(s.members);
  std::vector<std::thread> ts;
  for (int r = 0; r < s.members; ++r)
    ts.emplace_back([&, r] {
      auto& msg = out[static_cast<std::size_t>(r)];
      open_options o;
      o.rank = r;
      o.size = s.members;
      o.world_ranks = s.world_ranks;
      if (o.world_ranks.empty())
        for (int m = 0; m < s.members; ++m) o.world_ranks.push_back(m);
      o.group = "group 'shm-test'";
      o.enabled = std::find(s.disabled.begin(), s.disabled.end(), r) == s.disabled.end();
      o.single_copy =
          std::find(s.no_single_copy.begin(), s.no_single_copy.end(), r) == s.no_single_copy.end()
              ? s.single_copy
              : single_copy_mode::off;
      o.slot_bytes = s.slot_bytes;
      o.pipes = s.pipes;
      o.reads = s.reads;
      o.timeout = s.timeout;
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      const bool pinned = s.one_cpu && ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0;
      if (pinned) {
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &cpus)) {
            CPU_SET(c, &one);
            break;
          }
        ::sched_setaffinity(0, sizeof(one), &one);
      }
      auto seg = segment::open(store, o);
      if (pinned) ::sched_setaffinity(0, sizeof(cpus), &cpus);
      if (seg && *seg) all[static_cast<std::size_t>(r)] = seg->get();
      opened.arrive_and_wait();
      if (!seg) {
        msg = "open: " + seg.error().to_string();
      } else if (!*seg) {
        msg = "no segment";
      } else {
        member m{r, s.members, **seg, all};
        try {
          msg = body(m);
        } catch (const troupe::exception& e) {
          msg = describe_throw(e);
        }
      }
      finished.arrive_and_wait();
    });
  for (auto& t : ts) t.join();
  return out;
}

inline clock::time_point in(duration d) { return clock::now() + d; }

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Floats of widely different magnitudes, so that sums depend on the order of the fold.
inline float fvalue(int rank, std::size_t i, std::uint64_t salt = 0) {
  const auto h = mix((salt << 40) ^ (static_cast<std::uint64_t>(rank) << 32) ^ (i + 1));
  const float m = (static_cast<float>(h % 20001) - 10000.0f) / 1000.0f;
  return std::ldexp(m, static_cast<int>((h >> 20) % 24) - 12);
}

// (((v0 + v1) + v2) + v3): the rank-order fold every member must reproduce bit for bit.
inline float rank_order_sum(int members, std::size_t i, std::uint64_t salt = 0) {
  float acc = fvalue(0, i, salt);
  for (int r = 1; r < members; ++r) acc = acc + fvalue(r, i, salt);
  return acc;
}

inline std::int64_t ivalue(int rank, std::size_t i) {
  return static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(rank) * 7919 + i) >> 2) -
         (std::int64_t{1} << 60);
}

// Element counts for one element of `es` bytes and `slot` bytes per slot: one element,
// fewer than the members, exactly one slot, several slots plus a remainder shorter than
// the members and one longer.
inline std::vector<std::size_t> sizes(std::size_t es, int members, std::size_t slot = small_slot) {
  const std::size_t per = slot / es;
  return {1, static_cast<std::size_t>(members - 1), per, 3 * per + 1, 3 * per + 7};
}

inline std::string bits_mismatch(const char* what, std::size_t count, std::size_t i, float got,
                                 float want) {
  return strcat(what, " of ", count, " elements, element ", i, ": got ", got, " (bits ",
                std::bit_cast<std::uint32_t>(got), "), want ", want, " (bits ",
                std::bit_cast<std::uint32_t>(want), ")");
}

// A float32 sum of `count` elements; "" when every element equals the rank-order fold bit
// for bit. With `average`, the segment divides by the member count (avg) and every element
// must equal that fold divided by it.
inline std::string float_sum(member& m, std::uint64_t& seq, std::size_t count, std::uint64_t salt,
                             duration timeout = 10s, bool average = false) {
  static const auto fn = *cpu_reduce(dtype::float32, reduce_op::sum);
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = fvalue(m.rank, i, salt);
  const auto op = average ? reduce_op::avg : reduce_op::sum;
  const std::size_t divisor = average ? static_cast<std::size_t>(m.size) : 1;
  must(m.seg.allreduce(seq++, tensor_view::of(std::span(v)), op, fn, divisor, in(timeout)));
  for (std::size_t i = 0; i < count; ++i) {
    float want = rank_order_sum(m.size, i, salt);
    if (average) want /= static_cast<float>(m.size);
    if (std::bit_cast<std::uint32_t>(v[i]) != std::bit_cast<std::uint32_t>(want))
      return bits_mismatch(average ? "float32 avg" : "float32 sum", count, i, v[i], want);
  }
  return "";
}

// An int64 sum, max or product (of small operands) of `count` elements.
inline std::string int64_reduce(member& m, std::uint64_t& seq, std::size_t count, reduce_op op) {
  const auto fn = *cpu_reduce(dtype::int64, op);
  auto value = [&](int r, std::size_t i) -> std::int64_t {
    if (op == reduce_op::product) return 1 + static_cast<std::int64_t>((r + i) % 3);
    return op == reduce_op::sum ? ivalue(r, i) / 16 : ivalue(r, i);
  };
  std::vector<std::int64_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(m.rank, i);
  must(m.seg.allreduce(seq++, tensor_view::of(std::span(v)), op, fn, 1, in(10s)));
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t want = value(0, i);
    for (int r = 1; r < m.size; ++r)
      want = op == reduce_op::product ? want * value(r, i)
             : op == reduce_op::sum   ? want + value(r, i)
                                      : std::max(want, value(r, i));
    if (v[i] != want)
      return strcat("int64 ", to_string(op), " of ", count, " elements, element ", i, ": got ",
                    v[i], ", want ", want);
  }
  return "";
}

// A 16-bit float reduction of small integers, which both 16-bit types hold exactly.
inline std::string half_reduce(member& m, std::uint64_t& seq, dtype t, reduce_op op,
                               std::size_t count) {
  const auto fn = *cpu_reduce(t, op);
  auto value = [](int r, std::size_t i) {
    return static_cast<double>((r * 13 + static_cast<int>(i % 61)) % 63);
  };
  buffer b(t, count);
  for (std::size_t i = 0; i < count; ++i) b.set(i, value(m.rank, i));
  must(m.seg.allreduce(seq++, b.view(), op, fn, 1, in(10s)));
  for (std::size_t i = 0; i < count; ++i) {
    double want = value(0, i);
    for (int r = 1; r < m.size; ++r)
      want = op == reduce_op::sum ? want + value(r, i) : std::min(want, value(r, i));
    if (b.get(i) != want)
      return strcat(to_string(t), " ", to_string(op), " of ", count, " elements, element ", i,
                    ": got ", b.get(i), ", want ", want);
  }
  return "";
}

// A broadcast of `count` float32 elements from `root`; the others start with other data.
// Where a test's tensors lie: ordinary memory, or shared host memory
// (shared_host_tensor), which the other members map and copy with plain copies.
enum class memory { plain, shared };

// `n` elements of T set to `fill`, where `where` says.
template <class T>
class elements {
 public:
  elements(std::size_t n, T fill, memory where) : n_(n) {
    if (where == memory::shared && n > 0) {
      auto t = shared_host_tensor(dtype_of<T>(), {static_cast<std::int64_t>(n)});
      if (!t) throw troupe::exception(std::move(t).error());
      shared_ = std::move(*t);
      p_ = static_cast<T*>(shared_.data());
    } else {
      plain_.resize(n);
      p_ = plain_.data();
    }
    std::fill(p_, p_ + n, fill);
  }
  T& operator[](std::size_t i) { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  std::span<T> span() { return {p_, n_}; }

 private:
  template <class U>
  static constexpr dtype dtype_of() {
    if constexpr (std::is_same_v<U, float>)
      return dtype::float32;
    else
      return dtype::int64;
  }
  std::size_t n_;
  std::vector<T> plain_;
  tensor shared_;
  T* p_ = nullptr;
};

inline std::string float_broadcast(member& m, std::uint64_t& seq, std::size_t count, int root,
                                   std::uint64_t salt, memory where = memory::plain) {
  elements<float> v(count, 0.0f, where);
  for (std::size_t i = 0; i < count; ++i) v[i] = fvalue(m.rank, i, salt);
  must(m.seg.broadcast(seq++, tensor_view::of(v.span()), root, in(10s)));
  for (std::size_t i = 0; i < count; ++i)
    if (std::bit_cast<std::uint32_t>(v[i]) != std::bit_cast<std::uint32_t>(fvalue(root, i, salt)))
      return strcat("broadcast from ", root, ": ",
                    bits_mismatch("broadcast", count, i, v[i], fvalue(root, i, salt)));
  return "";
}

// An allgather of `count` int64 elements per member; with `in_place` the input is this
// member's block of the output.
inline std::string int64_allgather(member& m, std::uint64_t& seq, std::size_t count, bool in_place,
                                   memory where = memory::plain) {
  const auto n = static_cast<std::size_t>(m.size), me = static_cast<std::size_t>(m.rank);
  elements<std::int64_t> out(count * n, -1, where), own(count, 0, where);
  for (std::size_t i = 0; i < count; ++i) own[i] = ivalue(m.rank, i);
  auto out_view = tensor_view::of(out.span());
  tensor_view in_view = tensor_view::of(own.span());
  if (in_place) {
    std::copy(own.begin(), own.end(), out.begin() + static_cast<std::ptrdiff_t>(me * count));
    in_view = out_view.slice(me * count, count);
  }
  must(m.seg.allgather(seq++, in_view, out_view, in(10s)));
  for (int r = 0; r < m.size; ++r)
    for (std::size_t i = 0; i < count; ++i) {
      const auto got = out[static_cast<std::size_t>(r) * count + i];
      if (got != ivalue(r, i))
        return strcat("allgather of ", count, " elements per member", in_place ? " (in place)" : "",
                      ": block ", r, " element ", i, ": got ", got, ", want ", ivalue(r, i));
    }
  return "";
}

// Entries of /dev/shm that segments opened by this process would have.
inline std::vector<std::string> own_shm_names() {
  const std::string prefix = strcat("troupe-", ::getpid(), "-");
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    auto name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Checks that the message of every member (in `out`) contains each of `parts`.
inline void check_each_contains(const std::vector<std::string>& out,
                                std::initializer_list<std::string> parts) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    CAPTURE(out[r]);
    for (const auto& part : parts) CHECK(contains(out[r], part));
  }
}

// Runs `body` on groups of 2, 3 and 4 members (with `slot_bytes` per slot when not 0)
// and checks that every member succeeded.
template <class F>
void check_at_2_to_4(F body, std::size_t slot_bytes = 0) {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    auto s = group_of(n);
    if (slot_bytes != 0) s = s.with_slot(slot_bytes);
    check_all(on_members(s, body));
  }
}

// The CPUs this process may run on.
inline int cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// Whether two members can run at once here (the single-copy allgather needs it).
inline bool two_cpus() { return cpus() >= 2; }

// The floats of each broadcast of one_copy_broadcasts(): around 64 KiB, several 120 KiB
// pieces of the pipes, and just over 4 MiB.
inline constexpr std::size_t one_copy_broadcast_counts[] = {16383,  16384,  16385,
                                                            100003, 300007, 1048583};

// The segment's sizes from which broadcasts copy once, as the last one_copy_broadcasts()
// saw them: ordinary buffers (segment::broadcast_once_from(), 16 or 256 KiB as rank 0
// measured the cost of reading another process's memory), and buffers that every member's
// last broadcast found in shared host memory (segment::shared_broadcast_once_from(), 16 or
// 64 KiB).
inline std::atomic<std::size_t> seen_broadcast_once_from{256 << 10};
inline std::atomic<std::size_t> seen_shared_broadcast_once_from{64 << 10};

// How many times each member of `n` reads in one_copy_broadcasts(): the sizes from the
// segment's threshold (ordinary buffers, or with `shared` every member's in shared host
// memory) each from every root, n - 1 times a reader (three from 256 KiB, five from
// 64 KiB, all six from 16 KiB); members that outnumber the CPUs copy once only from 4 MiB
// (the last).
inline std::uint64_t one_copy_reads(int n, bool shared = false) {
  std::uint64_t sizes = 1;
  if (n <= cpus()) {
    sizes = 0;
    const std::size_t from =
        shared ? seen_shared_broadcast_once_from.load() : seen_broadcast_once_from.load();
    for (std::size_t count : one_copy_broadcast_counts)
      if (count * sizeof(float) >= from) ++sizes;
  }
  return sizes * static_cast<std::uint64_t>(n - 1);
}

// Whether, with every member's tensors in shared host memory, the first broadcast
// one_copy_broadcasts() copies once through the mappings streamed through the ring
// instead (root 0's, of the smallest such size): members that all run at once learn that
// every buffer is shared from a broadcast, for the next, at the sizes where ordinary
// buffers take the ring.
inline bool first_shared_broadcast_streams(int n) {
  if (n > cpus()) return false;
  for (std::size_t count : one_copy_broadcast_counts)
    if (count * sizeof(float) >= seen_shared_broadcast_once_from.load() &&
        count * sizeof(float) < seen_broadcast_once_from.load())
      return true;
  return false;
}

// Broadcasts around the smallest sizes copied once (16 and 64 KiB), of several 120 KiB pieces of
// the pipes, and just over 4 MiB (the smallest copied once among more members than CPUs), from
// every root; the single-copy operations this member took part in go to
// `reads` (as a reader: the root's own copy counts for nothing).
// With `shared`, the members whose ranks it holds broadcast tensors in shared host memory;
// the copies made through mappings of them go to `mapped`.
inline std::string one_copy_broadcasts(member& m, std::vector<std::uint64_t>& reads,
                                       const std::vector<int>& shared = {},
                                       std::vector<std::uint64_t>* mapped = nullptr) {
  std::uint64_t seq = 1;
  const auto where = std::find(shared.begin(), shared.end(), m.rank) != shared.end()
                         ? memory::shared
                         : memory::plain;
  for (std::size_t count : one_copy_broadcast_counts)
    for (int root = 0; root < m.size; ++root)
      if (auto e = float_broadcast(m, seq, count, root, seq, where); !e.empty()) return e;
  reads[static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
  seen_broadcast_once_from = m.seg.broadcast_once_from();
  seen_shared_broadcast_once_from = m.seg.shared_broadcast_once_from();
  if (mapped) (*mapped)[static_cast<std::size_t>(m.rank)] = m.seg.mapped_copies();
  return "";
}

}  // namespace troupe::collectives::testing::shm
