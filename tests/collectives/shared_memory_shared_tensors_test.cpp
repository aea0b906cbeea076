// The gloo backend's shared-memory segment with tensors in shared host memory
// (shared_host_tensor), members as threads: which copies go through the members' mappings
// of one another's tensors, when the members choose those ways, and the results
// (fixture in shared_memory_members.hpp).
#include <doctest/doctest.h>

#include "shared_memory_members.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using namespace troupe::collectives::testing::shm;

TEST_CASE(
    "broadcasts from 64 KiB of tensors in shared host memory are copied with plain copies "
    "through the members' mappings of one another's tensors, and give every member the "
    "root's data at 2, 3 and 4 members") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<int> everyone;
    for (int r = 0; r < n; ++r) everyone.push_back(r);
    std::vector<std::uint64_t> reads(static_cast<std::size_t>(n), 0), mapped = reads;
    check_all(on_members(group_of(n).with_slot(gloo_shm::default_slot_bytes), [&](member& m) {
      auto e = one_copy_broadcasts(m, reads, everyone, &mapped);
      // Each operation's tensors are new: the mappings of those freed go when the next
      // are made, and at most those of one operation stay.
      if (e.empty() && m.seg.buffers_mapped_now() > static_cast<std::size_t>(n - 1))
        e = strcat(m.seg.buffers_mapped_now(), " buffers still mapped");
      return e;
    }));
    // Every single-copy broadcast a member reads is one copy from the root's tensor, and
    // every one it is the root of is one copy into each other member's. Members that
    // outnumber the CPUs copy the 1.2 MiB broadcasts once too, after the first (from root
    // 0, through the slots), which showed them that every member's tensor was shared; those
    // that all run at once copy once from 64 KiB where ordinary tensors stream through the
    // ring up to 256 KiB, after the first broadcast of 64 KiB (from root 0, through the ring).
    const bool streamed = first_shared_broadcast_streams(n);
    for (std::size_t r = 0; r < reads.size(); ++r) {
      CAPTURE(r);
      const auto n64 = static_cast<std::uint64_t>(n);
      const std::uint64_t mid_reads = n <= cpus() ? 0 : (r == 0 ? n64 - 1 : n64 - 2);
      const std::uint64_t mid_writes = n <= cpus() || r == 0 ? 0 : n64 - 1;
      const std::uint64_t ring_reads = streamed && r != 0 ? 1 : 0;
      const std::uint64_t ring_writes = streamed && r == 0 ? n64 - 1 : 0;
      CHECK(reads[r] == one_copy_reads(n, true) + mid_reads - ring_reads);
      CHECK(mapped[r] ==
            2 * one_copy_reads(n, true) + mid_reads + mid_writes - ring_reads - ring_writes);
    }
  }
}

namespace {

// What each member counted after each step of run_steps(): its single-copy operations
// (single_copy_reads()) and its copies through mappings (mapped_copies()), [step][rank].
struct step_counts {
  std::vector<std::vector<std::uint64_t>> once, mapped;

  // Each member's copies through mappings in step i (> 0).
  std::vector<std::uint64_t> mapped_in(std::size_t i) const {
    std::vector<std::uint64_t> d(mapped[i].size());
    for (std::size_t r = 0; r < d.size(); ++r) d[r] = mapped[i][r] - mapped[i - 1][r];
    return d;
  }
};

// Runs `steps` operations on every member of `s`, operation i as `op(member, seq, i)`
// (which returns what went wrong, or ""), and returns what the members counted after each.
template <class Op>
step_counts run_steps(const setup& s, std::size_t steps, Op op) {
  step_counts c;
  c.once.assign(steps, std::vector<std::uint64_t>(static_cast<std::size_t>(s.members)));
  c.mapped = c.once;
  check_all(on_members(s, [&](member& m) {
    std::uint64_t seq = 1;
    for (std::size_t i = 0; i < steps; ++i) {
      if (auto e = op(m, seq, i); !e.empty()) return strcat("step ", i, ": ", e);
      c.once[i][static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
      c.mapped[i][static_cast<std::size_t>(m.rank)] = m.seg.mapped_copies();
    }
    return std::string();
  }));
  return c;
}

// Checks that member r took a single-copy way in step i exactly when `once(i, r)`.
template <class Once>
void check_once(const step_counts& c, Once once) {
  for (std::size_t i = 0; i < c.once.size(); ++i)
    for (std::size_t r = 0; r < c.once[i].size(); ++r) {
      CAPTURE(i);
      CAPTURE(r);
      const std::uint64_t before = i == 0 ? 0 : c.once[i - 1][r];
      CHECK(c.once[i][r] - before == (once(i, static_cast<int>(r)) ? 1u : 0u));
    }
}

}  // namespace

TEST_CASE(
    "members that outnumber the CPUs broadcast from 512 KiB once, through their mappings, "
    "when every member's buffer of the last such broadcast was shared, and otherwise once "
    "only from 4 to 16 MiB and through the slots at other sizes, with the root's data on "
    "every member") {
  const int n = 3;
  constexpr int everyone = -2;
  // Each step: the size in floats, the root, the member whose buffer is ordinary (-1:
  // none; everyone), and whether the members copy it once.
  struct step {
    std::size_t count;
    int root;
    int plain;
    bool once;
  };
  const std::vector<step> steps{
      {262144, 0, -1, false},         // 1 MiB: no broadcast of the sizes before
      {262144, 1, -1, true},          // the last was all shared
      {262144, 0, 2, true},           // still: member 2's copies take system calls
      {262144, 2, -1, false},         // the last had an ordinary buffer
      {153600, 0, -1, true},          // 600 KiB, of the same sizes
      {65536, 1, -1, false},          // 256 KiB: through the slots, and it changes nothing
      {262144, 1, -1, true},          // 1 MiB again
      {4194304, 0, 1, true},          // 16 MiB, the last all shared
      {4194304, 2, -1, false},        // the last was not
      {1048576, 1, everyone, true},   // 4 MiB: once, shared or not
      {4194304, 0, everyone, false},  // 16 MiB, ordinary: the slots
      {4194304, 1, -1, false},        // 16 MiB, shared: the last was ordinary
      {2097152, 2, -1, true},         // 8 MiB
  };
  const auto c = run_steps(group_of(n).with_slot(gloo_shm::default_slot_bytes).on_one_cpu(),
                           steps.size(), [&](member& m, std::uint64_t& seq, std::size_t i) {
                             const auto& st = steps[i];
                             const bool plain = m.rank == st.plain || st.plain == everyone;
                             return float_broadcast(m, seq, st.count, st.root, seq,
                                                    plain ? memory::plain : memory::shared);
                           });
  // Each member but the root counts a broadcast copied once.
  check_once(c, [&](std::size_t i, int r) { return steps[i].once && r != steps[i].root; });
  // The broadcast with member 2's ordinary buffer: members 1 and 2 read the root's shared
  // buffer through their mappings, and the root wrote into member 1's through its mapping
  // but into member 2's with a system call.
  CHECK(c.mapped_in(2) == std::vector<std::uint64_t>{1, 1, 1});
}

TEST_CASE(
    "members that outnumber the CPUs write allgathers from 256 KiB per member into one "
    "another's outputs when every member's output of the last such allgather was shared, "
    "and go through the slots otherwise, with every block in place") {
  const int n = 3;
  // Each step: int64 elements per member, the member whose tensors are ordinary (-1:
  // none), whether the input lies in the output, and whether the members write.
  struct step {
    std::size_t count;
    int plain;
    bool in_place;
    bool writes;
  };
  const std::vector<step> steps{
      {32768, -1, false, false},  // 256 KiB: no allgather of the sizes before
      {32768, -1, false, true},   // the last was all shared
      {32768, 2, true, true},     // still: the blocks for member 2 take system calls
      {32768, -1, false, false},  // the last had an ordinary output
      {65536, -1, true, true},    // 512 KiB, of the same sizes
      {4096, -1, false, false},   // 32 KiB: through the slots, and it changes nothing
      {32768, -1, false, true},
  };
  const auto c =
      run_steps(group_of(n).with_slot(gloo_shm::default_slot_bytes).on_one_cpu(), steps.size(),
                [&](member& m, std::uint64_t& seq, std::size_t i) {
                  const auto& st = steps[i];
                  return int64_allgather(m, seq, st.count, st.in_place,
                                         m.rank == st.plain ? memory::plain : memory::shared);
                });
  check_once(c, [&](std::size_t i, int) { return steps[i].writes; });
  // With member 2's ordinary output: members 0 and 1 wrote into each other's through their
  // mappings and into member 2's with a system call; member 2 wrote into both through its
  // mappings.
  CHECK(c.mapped_in(2) == std::vector<std::uint64_t>{1, 1, 2});
}

TEST_CASE(
    "when one member's tensors lie in shared host memory and the others' do not, broadcasts "
    "copy through mappings only to and from that member's, and give every member the "
    "root's data") {
  const int n = 3;
  std::vector<std::uint64_t> reads(n, 0), mapped(n, 0);
  check_all(on_members(group_of(n).with_slot(gloo_shm::default_slot_bytes),
                       [&](member& m) { return one_copy_broadcasts(m, reads, {0}, &mapped); }));
  // Member 0 reads the others' ordinary tensors and writes into them with system calls;
  // each other member reads member 0's tensor and writes into it through its mapping, once
  // per size copied once.
  const auto per_member = one_copy_reads(n) / (n - 1);
  CHECK(mapped[0] == 0);
  CHECK(mapped[1] == 2 * per_member);
  CHECK(mapped[2] == 2 * per_member);
}

TEST_CASE(
    "a member maps another's shared host tensor once for all the operations that use it, "
    "and drops the mapping once the tensor is freed") {
  std::vector<std::uint64_t> mapped(2, 0), copies(2, 0);
  std::vector<std::size_t> left(2, 0);
  check_all(on_members(group_of(2).with_slot(gloo_shm::default_slot_bytes), [&](member& m) {
    std::uint64_t seq = 1;
    for (int round = 0; round < 2; ++round) {
      elements<float> v(1 << 18, 0.0f, memory::shared);  // 1 MiB
      for (int i = 0; i < 3; ++i) {
        for (std::size_t k = 0; k < (1 << 18); ++k) v[k] = fvalue(m.rank, k, seq);
        must(m.seg.broadcast(seq, tensor_view::of(v.span()), 0, in(10s)));
        for (std::size_t k = 0; k < (1 << 18); ++k)
          if (v[k] != fvalue(0, k, seq)) return strcat("round ", round, " element ", k);
        ++seq;
      }
      // Both members freed their tensors before either makes the next.
      must(m.seg.barrier(seq++, in(10s)));
    }
    mapped[static_cast<std::size_t>(m.rank)] = m.seg.buffers_mapped();
    copies[static_cast<std::size_t>(m.rank)] = m.seg.mapped_copies();
    left[static_cast<std::size_t>(m.rank)] = m.seg.buffers_mapped_now();
    return std::string();
  }));
  // On one CPU a broadcast of 1 MiB goes through the slots, and nothing is mapped.
  const bool copied_once = two_cpus();
  for (int r = 0; r < 2; ++r) {
    CHECK(mapped[static_cast<std::size_t>(r)] == (copied_once ? 2u : 0u));
    CHECK(copies[static_cast<std::size_t>(r)] == (copied_once ? 6u : 0u));
    CHECK(left[static_cast<std::size_t>(r)] == (copied_once ? 1u : 0u));
  }
}

TEST_CASE(
    "allgathers from 256 KiB per member of tensors in shared host memory write each block "
    "into the others' outputs through their mappings, and put every block in place, apart "
    "and in place") {
  std::vector<std::uint64_t> reads(2, 0), mapped(2, 0);
  check_all(on_members(
      group_of(2).with_slot(gloo_shm::default_slot_bytes), [&](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (std::size_t count : {32768, 32769, 300007})
          for (bool in_place : {false, true})
            if (auto e = int64_allgather(m, seq, count, in_place, memory::shared); !e.empty())
              return e;
        reads[static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
        mapped[static_cast<std::size_t>(m.rank)] = m.seg.mapped_copies();
        return "";
      }));
  const std::uint64_t want = two_cpus() ? 6 : 0;
  for (int r = 0; r < 2; ++r) {
    CHECK(reads[static_cast<std::size_t>(r)] == want);
    CHECK(mapped[static_cast<std::size_t>(r)] == want);
  }
}

TEST_CASE(
    "allgathers of 32-192 KiB per member read the others' inputs through mappings instead "
    "of the pipes once the last one found every input in shared host memory, and put every "
    "block in place") {
  // Member 0's inputs are always shared; member 1's are too except in allgather 3. Each
  // allgather reads (single copy always): through the pipes when the one before did not
  // find every input shared (0 and 4), else through mappings, where a member reads an
  // input that is not shared with process_vm_readv (member 0 in allgather 3).
  std::vector<std::uint64_t> reads(2, 0), mapped(2, 0);
  check_all(on_members(
      group_of(2).with_slot(gloo_shm::default_slot_bytes), [&](member& m) -> std::string {
        std::uint64_t seq = 1;
        for (int i = 0; i < 6; ++i) {
          const auto where = m.rank == 1 && i == 3 ? memory::plain : memory::shared;
          if (auto e = int64_allgather(m, seq, 16384, i % 2 == 1, where); !e.empty())
            return strcat("allgather ", i, ": ", e);
        }
        reads[static_cast<std::size_t>(m.rank)] = m.seg.single_copy_reads();
        mapped[static_cast<std::size_t>(m.rank)] = m.seg.mapped_copies();
        return "";
      }));
  // On one CPU these allgathers go through the slots.
  const bool once = two_cpus();
  CHECK(reads[0] == (once ? 6u : 0u));
  CHECK(reads[1] == (once ? 6u : 0u));
  CHECK(mapped[0] == (once ? 3u : 0u));
  CHECK(mapped[1] == (once ? 4u : 0u));
}
