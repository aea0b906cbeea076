// The gloo backend's shared-memory segment on its own: members are threads of this
// process, each opening the segment with its rank over one in-process store. Small slots
// (4 KiB) split the tensors into many chunks, so that both buffers of every slot and the
// guards between them are used.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <latch>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collectives/gloo/cpu_reduce.hpp"
#include "collectives/gloo/shared_memory.hpp"
#include "core/strcat.hpp"
#include "op_suite.hpp"
#include "store/memory_store.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using troupe::collectives::gloo_shm::open_options;
using troupe::collectives::gloo_shm::segment;
using troupe::collectives::testing::buffer;

namespace {

constexpr std::size_t small_slot = 4096;

struct setup {
  int members = 2;
  std::size_t slot_bytes = small_slot;
  std::vector<int> world_ranks;  // empty: the group ranks
  std::vector<int> disabled;     // members that turn shared memory off
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
};

setup group_of(int members, std::vector<int> world_ranks = {}) {
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

std::string describe_throw(const troupe::exception& e) {
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
      o.slot_bytes = s.slot_bytes;
      o.timeout = s.timeout;
      auto seg = segment::open(store, o);
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

void check_all(const std::vector<std::string>& out) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    CAPTURE(r);
    CHECK(out[r] == "");
  }
}

clock::time_point in(duration d) { return clock::now() + d; }

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Floats of widely different magnitudes, so that sums depend on the order of the fold.
float fvalue(int rank, std::size_t i, std::uint64_t salt = 0) {
  const auto h = mix((salt << 40) ^ (static_cast<std::uint64_t>(rank) << 32) ^ (i + 1));
  const float m = (static_cast<float>(h % 20001) - 10000.0f) / 1000.0f;
  return std::ldexp(m, static_cast<int>((h >> 20) % 24) - 12);
}

// (((v0 + v1) + v2) + v3): the rank-order fold every member must reproduce bit for bit.
float rank_order_sum(int members, std::size_t i, std::uint64_t salt = 0) {
  float acc = fvalue(0, i, salt);
  for (int r = 1; r < members; ++r) acc = acc + fvalue(r, i, salt);
  return acc;
}

std::int64_t ivalue(int rank, std::size_t i) {
  return static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(rank) * 7919 + i) >> 2) -
         (std::int64_t{1} << 60);
}

// Element counts for one element of `es` bytes and `slot` bytes per slot: one element,
// fewer than the members, exactly one slot, several slots plus a remainder shorter than
// the members and one longer.
std::vector<std::size_t> sizes(std::size_t es, int members, std::size_t slot = small_slot) {
  const std::size_t per = slot / es;
  return {1, static_cast<std::size_t>(members - 1), per, 3 * per + 1, 3 * per + 7};
}

std::string bits_mismatch(const char* what, std::size_t count, std::size_t i, float got,
                          float want) {
  return strcat(what, " of ", count, " elements, element ", i, ": got ", got, " (bits ",
                std::bit_cast<std::uint32_t>(got), "), want ", want, " (bits ",
                std::bit_cast<std::uint32_t>(want), ")");
}

// A float32 sum of `count` elements; "" when every element equals the rank-order fold bit
// for bit.
std::string float_sum(member& m, std::uint64_t& seq, std::size_t count, std::uint64_t salt,
                      duration timeout = 10s) {
  static const auto fn = *cpu_reduce(dtype::float32, reduce_op::sum);
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = fvalue(m.rank, i, salt);
  m.seg.allreduce(seq++, tensor_view::of(std::span(v)), reduce_op::sum, fn, in(timeout));
  for (std::size_t i = 0; i < count; ++i) {
    const float want = rank_order_sum(m.size, i, salt);
    if (std::bit_cast<std::uint32_t>(v[i]) != std::bit_cast<std::uint32_t>(want))
      return bits_mismatch("float32 sum", count, i, v[i], want);
  }
  return "";
}

// An int64 sum, max or product (of small operands) of `count` elements.
std::string int64_reduce(member& m, std::uint64_t& seq, std::size_t count, reduce_op op) {
  const auto fn = *cpu_reduce(dtype::int64, op);
  auto value = [&](int r, std::size_t i) -> std::int64_t {
    if (op == reduce_op::product) return 1 + static_cast<std::int64_t>((r + i) % 3);
    return op == reduce_op::sum ? ivalue(r, i) / 16 : ivalue(r, i);
  };
  std::vector<std::int64_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(m.rank, i);
  m.seg.allreduce(seq++, tensor_view::of(std::span(v)), op, fn, in(10s));
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
std::string half_reduce(member& m, std::uint64_t& seq, dtype t, reduce_op op, std::size_t count) {
  const auto fn = *cpu_reduce(t, op);
  auto value = [](int r, std::size_t i) {
    return static_cast<double>((r * 13 + static_cast<int>(i % 61)) % 63);
  };
  buffer b(t, count);
  for (std::size_t i = 0; i < count; ++i) b.set(i, value(m.rank, i));
  m.seg.allreduce(seq++, b.view(), op, fn, in(10s));
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
std::string float_broadcast(member& m, std::uint64_t& seq, std::size_t count, int root,
                            std::uint64_t salt) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = fvalue(m.rank, i, salt);
  m.seg.broadcast(seq++, tensor_view::of(std::span(v)), root, in(10s));
  for (std::size_t i = 0; i < count; ++i)
    if (std::bit_cast<std::uint32_t>(v[i]) !=
        std::bit_cast<std::uint32_t>(fvalue(root, i, salt)))
      return strcat("broadcast from ", root, ": ",
                    bits_mismatch("broadcast", count, i, v[i], fvalue(root, i, salt)));
  return "";
}

// An allgather of `count` int64 elements per member; with `in_place` the input is this
// member's block of the output.
std::string int64_allgather(member& m, std::uint64_t& seq, std::size_t count, bool in_place) {
  const auto n = static_cast<std::size_t>(m.size), me = static_cast<std::size_t>(m.rank);
  std::vector<std::int64_t> out(count * n, -1), own(count);
  for (std::size_t i = 0; i < count; ++i) own[i] = ivalue(m.rank, i);
  auto out_view = tensor_view::of(std::span(out));
  tensor_view in_view = tensor_view::of(std::span(own));
  if (in_place) {
    std::copy(own.begin(), own.end(), out.begin() + static_cast<std::ptrdiff_t>(me * count));
    in_view = out_view.slice(me * count, count);
  }
  m.seg.allgather(seq++, in_view, out_view, in(10s));
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
std::vector<std::string> own_shm_names() {
  const std::string prefix = strcat("troupe-", ::getpid(), "-");
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    auto name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
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

}  // namespace

TEST_CASE("allreduce gives every member the exact result at 2, 3 and 4 members, for sizes that "
          "do not divide into slots or members") {
  check_at_2_to_4([](member& m) -> std::string {
    std::uint64_t seq = 1;
    for (std::size_t count : sizes(sizeof(float), m.size))
      if (auto e = float_sum(m, seq, count, count); !e.empty()) return e;
    for (std::size_t count : sizes(sizeof(std::int64_t), m.size)) {
      if (auto e = int64_reduce(m, seq, count, reduce_op::sum); !e.empty()) return e;
      if (auto e = int64_reduce(m, seq, count, reduce_op::max); !e.empty()) return e;
      if (auto e = int64_reduce(m, seq, count, reduce_op::product); !e.empty()) return e;
    }
    for (std::size_t count : sizes(2, m.size)) {
      if (auto e = half_reduce(m, seq, dtype::bfloat16, reduce_op::sum, count); !e.empty())
        return e;
      if (auto e = half_reduce(m, seq, dtype::float16, reduce_op::min, count); !e.empty())
        return e;
    }
    return "";
  });
}

TEST_CASE("a float sum is the rank-order fold, bit for bit on every member, below and above the "
          "size that every member folds whole") {
  // The data must make the order matter, or this test could not tell the orders apart.
  std::size_t order_sensitive = 0;
  for (std::size_t i = 0; i < 1000; ++i)
    order_sensitive +=
        rank_order_sum(4, i) != ((fvalue(3, i) + fvalue(2, i)) + fvalue(1, i)) + fvalue(0, i);
  REQUIRE(order_sensitive > 10);
  check_at_2_to_4(
      [](member& m) -> std::string {
        std::uint64_t seq = 1;
        // 16 KB and 60 KB are folded whole; 400 KB is split among the members; 1.2 MB
        // takes two slots.
        for (std::size_t count : {4001, 15001, 100003, 300007})
          if (auto e = float_sum(m, seq, count, count); !e.empty()) return e;
        return "";
      },
      gloo_shm::default_slot_bytes);
}

TEST_CASE("broadcast from every root gives every member the root's data at 2, 3 and 4 members") {
  check_at_2_to_4([](member& m) -> std::string {
    std::uint64_t seq = 1;
    for (std::size_t count : sizes(sizeof(float), m.size))
      for (int root = 0; root < m.size; ++root)
        if (auto e = float_broadcast(m, seq, count, root, seq); !e.empty()) return e;
    return "";
  });
}

TEST_CASE("allgather puts every member's block in place at 2, 3 and 4 members") {
  check_at_2_to_4([](member& m) -> std::string {
    std::uint64_t seq = 1;
    for (std::size_t count : sizes(sizeof(std::int64_t), m.size))
      for (bool in_place : {false, true})
        if (auto e = int64_allgather(m, seq, count, in_place); !e.empty()) return e;
    return "";
  });
}

TEST_CASE("operations back to back reuse both buffers correctly while members run at different "
          "speeds") {
  check_all(on_members(group_of(4), [](member& m) -> std::string {
    std::uint64_t seq = 1;
    const std::size_t per = small_slot / sizeof(float);
    for (std::uint64_t k = 0; k < 40; ++k) {
      // Members fall behind one another by up to a few hundred microseconds.
      if (mix(k * 31 + static_cast<std::uint64_t>(m.rank)) % 3 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(mix(k + 7) % 400));
      const std::size_t count = k % 2 == 0 ? 3 * per + k : 1 + k;
      std::string e;
      switch (k % 4) {
        case 0:  // a broadcast, then an allreduce
          e = float_broadcast(m, seq, count, static_cast<int>(k / 4) % m.size, k);
          if (e.empty()) e = float_sum(m, seq, count, k);
          break;
        case 1:  // broadcasts from changing roots
          for (int root : {1, 3, 0, 2})
            if (e.empty()) e = float_broadcast(m, seq, count, root, k + 100 * static_cast<std::uint64_t>(root));
          break;
        case 2:
          e = int64_allgather(m, seq, count, k % 8 == 2);
          if (e.empty()) e = float_broadcast(m, seq, count, 3, k);
          break;
        default:
          e = float_sum(m, seq, count, k);
          if (e.empty()) e = int64_allgather(m, seq, count, false);
          break;
      }
      if (!e.empty()) return strcat("step ", k, ": ", e);
    }
    return "";
  }));
}

TEST_CASE("members that disagree on the size of an allreduce all fail naming each other and "
          "both sizes") {
  auto start = clock::now();
  auto out = on_members(group_of(3, {10, 11, 12}), [](member& m) -> std::string {
    std::uint64_t seq = 5;
    // Member 2 asks for one chunk more than the others.
    std::size_t count = m.rank == 2 ? 2048 : 1024;
    return float_sum(m, seq, count, 0);
  });
  CHECK(clock::now() - start < 5s);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto& msg = out[static_cast<std::size_t>(r)];
    CAPTURE(msg);
    CHECK(contains(msg, "threw invalid_argument"));
    CHECK(contains(msg, "collective #5"));
    CHECK(contains(msg, "allreduce of 4096 bytes (float32, sum)"));
    CHECK(contains(msg, "allreduce of 8192 bytes (float32, sum)"));
    // Each names itself and a member that asked for something else.
    CHECK(contains(msg, strcat("rank ", 10 + r, " (this one)")));
    CHECK(contains(msg, r == 2 ? "rank 10 runs" : "rank 12 runs"));
  }
}

TEST_CASE("members that disagree on the dtype of an allreduce of the same bytes fail") {
  auto out = on_members(group_of(2), [](member& m) -> std::string {
    std::vector<std::int32_t> v(64, 1);
    auto t = tensor_view::of(std::span(v));
    if (m.rank == 1) t.type = dtype::float32;
    m.seg.allreduce(1, t, reduce_op::sum, *cpu_reduce(t.type, reduce_op::sum), in(10s));
    return "";
  });
  for (auto& msg : out) {
    CAPTURE(msg);
    CHECK(contains(msg, "threw invalid_argument"));
    CHECK(contains(msg, "(int32, sum)"));
    CHECK(contains(msg, "(float32, sum)"));
  }
}

TEST_CASE("members that disagree on the size of a broadcast all fail within the deadline") {
  for (int root : {0, 2}) {
    CAPTURE(root);
    auto start = clock::now();
    auto out = on_members(group_of(3, {10, 11, 12}), [root](member& m) {
      std::uint64_t seq = 3;
      // Member 1 asks for more bytes: one chunk more (root 0) or fewer chunks (root 2).
      std::size_t count = m.rank == 1 ? (root == 0 ? 2048 : 100) : 1024;
      return float_broadcast(m, seq, count, root, 0);
    });
    CHECK(clock::now() - start < 5s);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const auto& msg = out[static_cast<std::size_t>(r)];
      CAPTURE(msg);
      CHECK(contains(msg, "threw invalid_argument"));
      CHECK(contains(msg, strcat("broadcast of 4096 bytes from rank ", root)));
      CHECK(contains(msg, root == 0 ? "broadcast of 8192 bytes" : "broadcast of 400 bytes"));
    }
  }
}

TEST_CASE("members that disagree on the root of a broadcast all fail naming both roots") {
  // Member 0 takes itself for the root; the others take member 1.
  auto start = clock::now();
  auto out = on_members(group_of(3, {10, 11, 12}), [](member& m) {
    std::uint64_t seq = 7;
    return float_broadcast(m, seq, 100, m.rank == 0 ? 0 : 1, 0);
  });
  CHECK(clock::now() - start < 5s);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto& msg = out[static_cast<std::size_t>(r)];
    CAPTURE(msg);
    CHECK(contains(msg, "threw invalid_argument"));
    CHECK(contains(msg, "broadcast of 400 bytes from rank 0"));
    CHECK(contains(msg, "broadcast of 400 bytes from rank 1"));
  }
}

TEST_CASE("members that each take the other for the root of a broadcast fail, not wait") {
  auto start = clock::now();
  auto out = on_members(group_of(2), [](member& m) {
    std::uint64_t seq = 2;
    return float_broadcast(m, seq, 100, 1 - m.rank, 0);
  });
  CHECK(clock::now() - start < 5s);
  for (auto& msg : out) {
    CAPTURE(msg);
    CHECK(contains(msg, "threw invalid_argument"));
  }
}

TEST_CASE("a member that never calls the operation makes the others time out at their deadline "
          "naming its world rank") {
  constexpr auto timeout = 300ms;
  enum class op { allreduce, allgather, broadcast_root_missing, broadcast_reader_missing, barrier };
  for (op which : {op::allreduce, op::allgather, op::broadcast_root_missing,
                   op::broadcast_reader_missing, op::barrier}) {
    CAPTURE(static_cast<int>(which));
    std::vector<duration> took(3);
    auto out = on_members(group_of(3, {10, 11, 12}), [&](member& m) {
      if (m.rank == 2) return std::string("skipped");
      std::uint64_t seq = 9;
      const auto start = clock::now();
      std::string e;
      try {
        switch (which) {
          case op::allreduce:
            e = float_sum(m, seq, 3000, 0, timeout);
            break;
          case op::allgather: {
            std::vector<float> own(10), all(30);
            m.seg.allgather(seq, tensor_view::of(std::span(own)), tensor_view::of(std::span(all)),
                            in(timeout));
            break;
          }
          case op::broadcast_root_missing: {
            std::vector<float> v(10);
            m.seg.broadcast(seq, tensor_view::of(std::span(v)), 2, in(timeout));
            break;
          }
          case op::broadcast_reader_missing: {
            // The root too waits until every member has the data (one chunk: with more,
            // the root waits for the missing member before writing the third one, and
            // the others then wait for the root).
            std::vector<float> v(10);
            m.seg.broadcast(seq, tensor_view::of(std::span(v)), 0, in(timeout));
            break;
          }
          case op::barrier:
            m.seg.barrier(seq, in(timeout));
            break;
        }
      } catch (...) {
        took[static_cast<std::size_t>(m.rank)] =
            std::chrono::duration_cast<duration>(clock::now() - start);
        throw;
      }
      return e;
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto& msg = out[static_cast<std::size_t>(r)];
      CAPTURE(msg);
      CHECK(contains(msg, "threw timeout"));
      CHECK(contains(msg, "collective #9"));
      CHECK(contains(msg, "rank [12]"));
      CHECK_FALSE(contains(msg, "[2]"));
      CHECK(took[static_cast<std::size_t>(r)] >= timeout);
      CHECK(took[static_cast<std::size_t>(r)] < timeout + 2s);
    }
  }
}

TEST_CASE("a barrier lets no member through until every member arrived") {
  // Members arrive 0, 60, 120 and 180 ms after the start; none may leave before the last
  // arrived, and a data operation after it still works.
  const auto start = clock::now();
  std::vector<clock::time_point> left(4);
  check_all(on_members(group_of(4), [&](member& m) -> std::string {
    std::this_thread::sleep_until(start + m.rank * 60ms);
    m.seg.barrier(1, in(10s));
    left[static_cast<std::size_t>(m.rank)] = clock::now();
    std::uint64_t seq = 2;
    return float_sum(m, seq, 1000, 1000);
  }));
  for (std::size_t r = 0; r < left.size(); ++r) {
    CAPTURE(r);
    CHECK(left[r] >= start + 180ms);
  }
}

TEST_CASE("a member that marks the segment failed wakes the others' waits at once") {
  std::vector<duration> took(3);
  auto out = on_members(group_of(3, {10, 11, 12}), [&](member& m) {
    if (m.rank == 0) {
      // Give the others time to go to sleep in their waits.
      std::this_thread::sleep_for(100ms);
      m.seg.mark_failed();
      return std::string("marked");
    }
    const auto start = clock::now();
    std::vector<float> v(10, 1.0f);
    try {
      m.seg.allreduce(1, tensor_view::of(std::span(v)), reduce_op::sum,
                      *cpu_reduce(dtype::float32, reduce_op::sum), in(20s));
    } catch (...) {
      took[static_cast<std::size_t>(m.rank)] =
          std::chrono::duration_cast<duration>(clock::now() - start);
      throw;
    }
    return std::string();
  });
  CHECK(out[0] == "marked");
  for (int r = 1; r < 3; ++r) {
    CAPTURE(r);
    const auto& msg = out[static_cast<std::size_t>(r)];
    CAPTURE(msg);
    CHECK(contains(msg, "threw connection_lost"));
    CHECK(contains(msg, "rank 10 failed"));
    CHECK(took[static_cast<std::size_t>(r)] < 3s);
  }
}

TEST_CASE("abort from another thread ends a waiting operation at once and fails later ones") {
  duration took{};
  std::string later;
  auto out = on_members(group_of(2), [&](member& m) {
    if (m.rank == 1) {
      // Never joins the allreduce; aborts member 0's segment while member 0 waits.
      std::this_thread::sleep_for(100ms);
      m.all[0]->abort();
      return std::string("aborted the other");
    }
    std::vector<float> v(10, 1.0f);
    auto fn = *cpu_reduce(dtype::float32, reduce_op::sum);
    const auto start = clock::now();
    try {
      m.seg.allreduce(1, tensor_view::of(std::span(v)), reduce_op::sum, fn, in(20s));
    } catch (const troupe::exception& e) {
      took = std::chrono::duration_cast<duration>(clock::now() - start);
      try {
        m.seg.broadcast(2, tensor_view::of(std::span(v)), 0, in(20s));
        later = "a later broadcast succeeded";
      } catch (const troupe::exception& e2) {
        later = describe_throw(e2);
      }
      throw;
    }
    return std::string();
  });
  CHECK(out[1] == "aborted the other");
  CAPTURE(out[0]);
  CHECK(contains(out[0], "threw aborted"));
  CHECK(took < 3s);
  CAPTURE(later);
  CHECK(contains(later, "threw aborted"));
}

TEST_CASE("one member that turns shared memory off leaves every member without a segment and "
          "nothing in /dev/shm") {
  REQUIRE(own_shm_names().empty());
  for (int off : {0, 2}) {
    CAPTURE(off);
    auto out = on_members(group_of(3).without_shm(off), [](member&) { return ""; });
    for (auto& msg : out) CHECK(msg == "no segment");
    CHECK(own_shm_names().empty());
  }
}

TEST_CASE("a segment that every member opened has no name left in /dev/shm") {
  REQUIRE(own_shm_names().empty());
  std::vector<std::vector<std::string>> seen(3);
  check_all(on_members(group_of(3), [&](member& m) {
    // Every member returned from open: rank 0 unlinked the name.
    seen[static_cast<std::size_t>(m.rank)] = own_shm_names();
    return "";
  }));
  for (auto& names : seen) CHECK(names.empty());
}

TEST_CASE("rank 0 whose members never answer gets an error within the timeout and leaves nothing "
          "in /dev/shm") {
  memory_store store;
  open_options o;
  o.rank = 0;
  o.size = 3;
  o.slot_bytes = small_slot;
  o.timeout = 200ms;
  const auto start = clock::now();
  auto seg = segment::open(store, o);
  CHECK(clock::now() - start < 3s);
  REQUIRE_FALSE(seg);
  CHECK(seg.error().code() == errc::timeout);
  CHECK(own_shm_names().empty());
}

TEST_CASE("a group of one gets no segment and does not touch the store") {
  memory_store store;
  open_options o;
  o.size = 1;
  auto seg = segment::open(store, o);
  REQUIRE(seg);
  CHECK(*seg == nullptr);
  CHECK(store.num_keys(1s).value() == 0);
}

TEST_CASE("rank 0's slot size holds for every member, rounded up to whole pages") {
  std::vector<std::size_t> slots(2);
  memory_store store;
  std::vector<std::thread> ts;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      open_options o;
      o.rank = r;
      o.size = 2;
      o.slot_bytes = r == 0 ? 5000 : 65536;
      o.timeout = 10s;
      auto seg = segment::open(store, o);
      if (!seg || !*seg)
        errors[static_cast<std::size_t>(r)] = seg ? "no segment" : seg.error().to_string();
      else
        slots[static_cast<std::size_t>(r)] = (*seg)->slot_bytes();
    });
  for (auto& t : ts) t.join();
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(slots == std::vector<std::size_t>{8192, 8192});
}

TEST_CASE("TROUPE_GLOO_SHM=0 turns shared memory off and TROUPE_GLOO_SHM_SLOT sets the slot size") {
  auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto shm = saved("TROUPE_GLOO_SHM"), slot = saved("TROUPE_GLOO_SHM_SLOT");
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v)
      ::setenv(name, v->c_str(), 1);
    else
      ::unsetenv(name);
  };
  ::setenv("TROUPE_GLOO_SHM", "0", 1);
  ::setenv("TROUPE_GLOO_SHM_SLOT", "65536", 1);
  open_options a;
  gloo_shm::apply_env(a);
  CHECK_FALSE(a.enabled);
  CHECK(a.slot_bytes == 65536);
  ::setenv("TROUPE_GLOO_SHM", "1", 1);
  ::setenv("TROUPE_GLOO_SHM_SLOT", "64k", 1);
  open_options b;
  gloo_shm::apply_env(b);
  CHECK(b.enabled);
  CHECK(b.slot_bytes == gloo_shm::default_slot_bytes);
  restore("TROUPE_GLOO_SHM", shm);
  restore("TROUPE_GLOO_SHM_SLOT", slot);
}
