// The gloo backend's shared-memory segment on its own, members as threads: results of
// every operation at 2 to 4 members (fixture in shared_memory_members.hpp).
#include <doctest/doctest.h>

#include "shared_memory_members.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using namespace troupe::collectives::testing::shm;

TEST_CASE(
    "allreduce gives every member the exact result at 2, 3 and 4 members, for sizes that "
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
      if (auto e = half_reduce(m, seq, dtype::float16, reduce_op::min, count); !e.empty()) return e;
    }
    return "";
  });
}

TEST_CASE(
    "a float sum is the rank-order fold, bit for bit on every member, below and above the "
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

TEST_CASE(
    "a float average is the rank-order fold divided by the member count, bit for bit on every "
    "member, below and above the size that every member folds whole") {
  check_at_2_to_4(
      [](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (std::size_t count : {1, 4001, 15001, 100003, 300007})
          if (auto e = float_sum(m, seq, count, count, 10s, true); !e.empty()) return e;
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

TEST_CASE(
    "broadcasts small enough to stream through the ring, and just too large for it, give "
    "every member the root's data") {
  // With a slot of the default size, broadcasts below the size copied once (16 or
  // 256 KiB) stream through a ring of four places when the members can all run at once
  // (here: up to as many members as CPUs), each piece a quarter of the data from 4 to
  // 32 KiB; whole slots above, and among more members than CPUs. Sizes around the
  // smallest piece, a quarter that is no whole cache line, the largest piece with the ring
  // reused within a broadcast (more than four pieces), and the ring's largest sizes.
  check_at_2_to_4(
      [](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (std::size_t count :
             {1, 1023, 1024, 1025, 4095, 4096, 4097, 10001, 32768, 32769, 65535, 65536, 65537})
          for (int root = 0; root < m.size; ++root)
            if (auto e = float_broadcast(m, seq, count, root, seq); !e.empty()) return e;
        return "";
      },
      gloo_shm::default_slot_bytes);
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

namespace {

// Allgathers around the sizes read from the others' memory (32 to 192 KiB per member),
// apart from and in place, with slots of the default size; whether the members read one
// another's memory afterwards goes to `reads`, and whether through pipes to `pipes`.
std::string single_copy_sizes(member& m, std::vector<char>& reads,
                              std::vector<char>* pipes = nullptr) {
  std::uint64_t seq = 1;
  for (std::size_t bytes :
       {std::size_t{32 << 10} - 8, std::size_t{32 << 10}, std::size_t{100 << 10} + 8,
        std::size_t{192 << 10}, std::size_t{192 << 10} + 8})
    for (bool in_place : {false, true})
      if (auto e = int64_allgather(m, seq, bytes / sizeof(std::int64_t), in_place); !e.empty())
        return e;
  reads[static_cast<std::size_t>(m.rank)] = m.seg.reads_members_memory() ? 1 : 0;
  if (pipes) (*pipes)[static_cast<std::size_t>(m.rank)] = m.seg.hands_over_through_pipes() ? 1 : 0;
  return "";
}

}  // namespace

TEST_CASE(
    "allgathers of 32 to 192 KiB per member take the others' blocks through pipes from where "
    "they lie and put every block in place, apart and in place") {
  std::vector<char> reads(2, 0), pipes(2, 0);
  check_all(on_members(group_of(2).with_slot(gloo_shm::default_slot_bytes),
                       [&](member& m) { return single_copy_sizes(m, reads, &pipes); }));
  // Only when the two members can run at once; otherwise the slots carry every block. The
  // pipes are there either way (broadcasts use them).
  const char want = two_cpus() ? 1 : 0;
  CHECK(reads[0] == want);
  CHECK(reads[1] == want);
  CHECK(pipes[0] == 1);
  CHECK(pipes[1] == 1);
}

TEST_CASE(
    "without the pipes, allgathers of 32 to 192 KiB per member read the others' blocks from "
    "their memory and put every block in place, apart and in place") {
  std::vector<char> reads(2, 0), pipes(2, 1);
  check_all(on_members(group_of(2).with_slot(gloo_shm::default_slot_bytes).without_pipes(),
                       [&](member& m) { return single_copy_sizes(m, reads, &pipes); }));
  const char want = two_cpus() ? 1 : 0;
  CHECK(reads[0] == want);
  CHECK(reads[1] == want);
  CHECK(pipes[0] == 0);
  CHECK(pipes[1] == 0);
}

TEST_CASE(
    "broadcasts from 64 KiB, or 16 KiB where reading another process's memory is cheap (4 MiB "
    "with more members than CPUs), are copied once, by the root and the others at once from "
    "one another's memory, and give every member the root's data at 2, 3 and 4 members") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::uint64_t> reads(static_cast<std::size_t>(n), 0);
    check_all(on_members(group_of(n).with_slot(gloo_shm::default_slot_bytes),
                         [&](member& m) { return one_copy_broadcasts(m, reads); }));
    for (auto r : reads) CHECK(r == one_copy_reads(n));
  }
}

TEST_CASE(
    "members that may not read one another's memory copy broadcasts from 64 KiB, or 16 KiB "
    "where reading is cheap (4 MiB with more members than CPUs), once through the pipes, in "
    "pieces, and give every member the root's data at 2, 3 and 4 members") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<std::uint64_t> reads(static_cast<std::size_t>(n), 0);
    check_all(on_members(group_of(n).with_slot(gloo_shm::default_slot_bytes).without_reads(),
                         [&](member& m) { return one_copy_broadcasts(m, reads); }));
    for (auto r : reads) CHECK(r == one_copy_reads(n));
  }
}

TEST_CASE(
    "without the pipes or reading one another's memory, broadcasts from 64 KiB go through the "
    "slots with the same results") {
  std::vector<std::uint64_t> reads(3, 1);
  check_all(on_members(
      group_of(3).with_slot(gloo_shm::default_slot_bytes).without_reads().without_pipes(),
      [&](member& m) { return one_copy_broadcasts(m, reads); }));
  for (auto r : reads) CHECK(r == 0);
}

TEST_CASE(
    "allgathers from 256 KiB per member write each block into the others' outputs when the "
    "members can run at once, and put every block in place, apart and in place") {
  for (bool reads_allowed : {true, false}) {
    CAPTURE(reads_allowed);
    std::vector<std::uint64_t> reads(2, 0);
    auto group = group_of(2).with_slot(gloo_shm::default_slot_bytes);
    check_all(
        on_members(reads_allowed ? group : group.without_reads(), [&](member& m) -> std::string {
          std::uint64_t seq = 1;
          for (std::size_t count : {32768, 32769, 300007})
            for (bool in_place : {false, true})
              if (auto e = int64_allgather(m, seq, count, in_place); !e.empty()) return e;
          reads[static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
          return "";
        }));
    // Six allgathers of those sizes; the slots when the members cannot reach one another's
    // memory (the pipes serve up to 192 KiB) or cannot run at once.
    const std::uint64_t want = reads_allowed && two_cpus() ? 6 : 0;
    CHECK(reads[0] == want);
    CHECK(reads[1] == want);
  }
}

TEST_CASE(
    "measured allgathers start reading the others' memory only when that is 5% faster both "
    "alone and from start to start, and keep it while it is no slower by either") {
  using gloo_shm::reads_next;
  // {slots, reading}, summed over the members, in ns.
  const std::uint64_t op_faster[2] = {10000, 7000}, op_close[2] = {10000, 9800},
                      op_slower[2] = {10000, 10100};
  const std::uint64_t period_faster[2] = {20000, 18000}, period_close[2] = {20000, 19500},
                      period_slower[2] = {20000, 22000};
  CHECK(reads_next(false, op_faster, period_faster));
  CHECK_FALSE(reads_next(false, op_faster, period_close));   // the loop gains too little
  CHECK_FALSE(reads_next(false, op_faster, period_slower));  // the owners pay after
  CHECK_FALSE(reads_next(false, op_close, period_faster));
  CHECK_FALSE(reads_next(false, op_slower, period_faster));
  CHECK(reads_next(true, op_close, period_close));  // no flapping within 5%
  CHECK(reads_next(true, op_faster, period_faster));
  CHECK_FALSE(reads_next(true, op_slower, period_faster));
  CHECK_FALSE(reads_next(true, op_faster, period_slower));
}

TEST_CASE(
    "by default the members time both ways of allgathering on their own allgathers, take the "
    "same way every time and get every block in place") {
  // Two size classes interleaved, each with its own choice: the cycles of a class (128,
  // 256, ... allgathers) end with 4 the other way unless the cycle follows a switch, so
  // 140 of each class read the others' memory at least 4 times when the members can run
  // at once, the same number of times on both (a member going another way than the other
  // would hang or mix data).
  std::vector<std::uint64_t> reads(2, 0);
  check_all(on_members(
      group_of(2)
          .with_slot(gloo_shm::default_slot_bytes)
          .with_single_copy(single_copy_mode::measured),
      [&](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (int i = 0; i < 280; ++i) {
          const std::size_t bytes = i % 2 ? std::size_t{128 << 10} : std::size_t{40 << 10};
          if (auto e = int64_allgather(m, seq, bytes / sizeof(std::int64_t), i % 4 < 2); !e.empty())
            return strcat("allgather ", i, ": ", e);
        }
        reads[static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
        return "";
      }));
  CHECK(reads[0] == reads[1]);
  if (two_cpus())
    CHECK(reads[0] >= 8);
  else
    CHECK(reads[0] == 0);
}

TEST_CASE(
    "one member that may not read the others' memory sends every member's allgather through "
    "the slots, with the same results") {
  for (int odd : {0, 1}) {
    CAPTURE(odd);
    std::vector<char> reads(2, 1);
    check_all(
        on_members(group_of(2).with_slot(gloo_shm::default_slot_bytes).without_single_copy(odd),
                   [&](member& m) { return single_copy_sizes(m, reads); }));
    CHECK(reads[0] == 0);
    CHECK(reads[1] == 0);
  }
}

TEST_CASE(
    "operations back to back reuse both buffers correctly while members run at different "
    "speeds, at 2 members (a ring for small broadcasts) and at 4") {
  for (int members : {2, 4}) {
    CAPTURE(members);
    check_all(on_members(group_of(members), [](member& m) -> std::string {
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
              if (root < m.size && e.empty())
                e = float_broadcast(m, seq, count, root,
                                    k + 100 * static_cast<std::uint64_t>(root));
            break;
          case 2:
            e = int64_allgather(m, seq, count, k % 8 == 2);
            if (e.empty()) e = float_broadcast(m, seq, count, m.size - 1, k);
            break;
          default:
            e = float_sum(m, seq, count, k);
            // Every other time 80 KB per member: read from the others' memory at 2.
            if (e.empty()) e = int64_allgather(m, seq, k % 8 == 3 ? 10000 : count, false);
            break;
        }
        if (!e.empty()) return strcat("step ", k, ": ", e);
      }
      return "";
    }));
  }
}

TEST_CASE(
    "operations numbered with gaps, as when the group runs others over TCP between them, agree "
    "while one member runs ahead") {
  // A member finishes an operation once every other one began it, then may skip ahead in
  // the group's numbering; the others must still find what it runs where they look.
  for (int members : {2, 3}) {
    CAPTURE(members);
    check_all(on_members(group_of(members), [](member& m) -> std::string {
      std::uint64_t seq = 1;
      for (std::uint64_t k = 0; k < 60; ++k) {
        seq += 1 + k % 7;  // the numbers the group gave its TCP operations
        // The last member lags by up to 200 microseconds.
        if (m.rank == m.size - 1 && mix(k) % 2 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(mix(k + 3) % 200));
        std::string e = k % 3 == 0   ? float_sum(m, seq, 100 + k, k)
                        : k % 3 == 1 ? int64_allgather(m, seq, 50 + k, false)
                                     : float_broadcast(m, seq, 70 + k, 0, k);
        if (!e.empty()) return strcat("step ", k, ": ", e);
      }
      return "";
    }));
  }
}

TEST_CASE("a barrier lets no member through until every member arrived") {
  // Members arrive 0, 60, 120 and 180 ms after the start; none may leave before the last
  // arrived, and a data operation after it still works.
  const auto start = clock::now();
  std::vector<clock::time_point> left(4);
  check_all(on_members(group_of(4), [&](member& m) -> std::string {
    std::this_thread::sleep_until(start + m.rank * 60ms);
    must(m.seg.barrier(1, in(10s)));
    left[static_cast<std::size_t>(m.rank)] = clock::now();
    std::uint64_t seq = 2;
    return float_sum(m, seq, 1000, 1000);
  }));
  for (std::size_t r = 0; r < left.size(); ++r) {
    CAPTURE(r);
    CHECK(left[r] >= start + 180ms);
  }
}

namespace {

// A float32 reduce_scatter with blocks of `per` elements: member r's output must be the
// rank-order fold of block r, bit for bit (the allreduce's block r).
// With `in_place`, the output is the member's own block of the input.
std::string float_reduce_scatter(member& m, std::uint64_t& seq, std::size_t per, std::uint64_t salt,
                                 bool in_place = false) {
  static const auto fn = *cpu_reduce(dtype::float32, reduce_op::sum);
  const auto n = static_cast<std::size_t>(m.size);
  std::vector<float> in(per * n), separate(per, -1.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = fvalue(m.rank, i, salt);
  const std::size_t base = static_cast<std::size_t>(m.rank) * per;
  const std::span<float> out =
      in_place ? std::span(in).subspan(base, per) : std::span<float>(separate);
  must(m.seg.reduce_scatter(seq++, tensor_view::of(std::span(in)), tensor_view::of(out),
                            reduce_op::sum, fn, clock::now() + 10s));
  for (std::size_t i = 0; i < per; ++i) {
    const float want = rank_order_sum(m.size, base + i, salt);
    if (std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(want))
      return bits_mismatch(in_place ? "float32 reduce_scatter in place" : "float32 reduce_scatter",
                           per, i, out[i], want);
  }
  return "";
}

}  // namespace

TEST_CASE(
    "reduce_scatter gives each member the rank-order fold of its block, bit for bit, at 2, 3 "
    "and 4 members, for blocks that do not divide into slots") {
  check_at_2_to_4([](member& m) -> std::string {
    std::uint64_t seq = 1;
    for (std::size_t per : sizes(sizeof(float), m.size))
      if (auto e = float_reduce_scatter(m, seq, per, per); !e.empty()) return e;
    // Back to back with an allreduce over the same buffers of the slots.
    if (auto e = float_sum(m, seq, 3000, 7); !e.empty()) return e;
    if (auto e = float_reduce_scatter(m, seq, 3001, 9); !e.empty()) return e;
    return "";
  });
}

TEST_CASE(
    "reduce_scatter into each member's own block of its input is the same rank-order fold, "
    "bit for bit, at 2, 3 and 4 members") {
  check_at_2_to_4(
      [](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (std::size_t per : {1, 1000, 70001, 300007})
          if (auto e = float_reduce_scatter(m, seq, per, per, true); !e.empty()) return e;
        return "";
      },
      gloo_shm::default_slot_bytes);
}

TEST_CASE("members that disagree on the size of a reduce_scatter all fail naming both sizes") {
  auto out = on_members(group_of(2), [](member& m) -> std::string {
    std::uint64_t seq = 3;
    return float_reduce_scatter(m, seq, m.rank == 0 ? 100 : 200, 0);
  });
  for (const auto& msg : out) {
    CAPTURE(msg);
    CHECK(msg.find("threw invalid_argument") != std::string::npos);
    CHECK(msg.find("reduce_scatter of 800 bytes (float32, sum)") != std::string::npos);
    CHECK(msg.find("reduce_scatter of 1600 bytes (float32, sum)") != std::string::npos);
  }
}
