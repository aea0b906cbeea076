// The gloo backend's shared-memory segment on its own, members as threads: members that
// disagree, never come, fail or abort, and how the segment is set up and torn down
// (fixture in shared_memory_members.hpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <troupe/collectives/gloo/shm_names.hpp>
#include "shared_memory_members.hpp"
#include "support/child_process.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using namespace troupe::collectives::testing::shm;

TEST_CASE(
    "members that disagree on the size of an allreduce all fail naming each other and "
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
    // Each names itself and a member that asked for something else: the odd one either
    // of the others (whichever it compared first), the others the odd one.
    CHECK(contains(msg, strcat("rank ", 10 + r, " (this one)")));
    if (r == 2)
      CHECK((contains(msg, "rank 10 runs") || contains(msg, "rank 11 runs")));
    else
      CHECK(contains(msg, "rank 12 runs"));
  }
}

TEST_CASE("members that disagree on the dtype of an allreduce of the same bytes fail") {
  auto out = on_members(group_of(2), [](member& m) -> std::string {
    std::vector<std::int32_t> v(64, 1);
    auto t = tensor_view::of(std::span(v));
    if (m.rank == 1) t.type = dtype::float32;
    must(m.seg.allreduce(1, t, reduce_op::sum, *cpu_reduce(t.type, reduce_op::sum), 1, in(10s)));
    return "";
  });
  check_each_contains(out, {"threw invalid_argument", "(int32, sum)", "(float32, sum)"});
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
    check_each_contains(
        out, {"threw invalid_argument", strcat("broadcast of 4096 bytes from rank ", root),
              root == 0 ? "broadcast of 8192 bytes" : "broadcast of 400 bytes"});
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
  check_each_contains(out, {"threw invalid_argument", "broadcast of 400 bytes from rank 0",
                            "broadcast of 400 bytes from rank 1"});
}

TEST_CASE("members that each take the other for the root of a broadcast fail, not wait") {
  auto start = clock::now();
  auto out = on_members(group_of(2), [](member& m) {
    std::uint64_t seq = 2;
    return float_broadcast(m, seq, 100, 1 - m.rank, 0);
  });
  CHECK(clock::now() - start < 5s);
  check_each_contains(out, {"threw invalid_argument"});
}

TEST_CASE(
    "a member that never calls the operation makes the others time out at their deadline "
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
            must(m.seg.allgather(seq, tensor_view::of(std::span(own)),
                                 tensor_view::of(std::span(all)), in(timeout)));
            break;
          }
          case op::broadcast_root_missing: {
            std::vector<float> v(10);
            must(m.seg.broadcast(seq, tensor_view::of(std::span(v)), 2, in(timeout)));
            break;
          }
          case op::broadcast_reader_missing: {
            // The root too waits for every member.
            std::vector<float> v(10);
            must(m.seg.broadcast(seq, tensor_view::of(std::span(v)), 0, in(timeout)));
            break;
          }
          case op::barrier:
            must(m.seg.barrier(seq, in(timeout)));
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

TEST_CASE(
    "members that disagree on the size of an allgather copied once fail naming both sizes, "
    "before any member writes into another's output") {
  // 80 and 96 KiB per member: both take the others' blocks through the pipes or their
  // memory; 2 and 3 MiB: each would write its block into the other's output.
  for (auto [mine, theirs] : {std::pair{10240, 12288}, std::pair{262144, 393216}}) {
    CAPTURE(mine);
    auto out =
        on_members(group_of(2, {10, 11}).with_slot(gloo_shm::default_slot_bytes),
                   [&](member& m) -> std::string {
                     std::uint64_t seq = 3;
                     return int64_allgather(
                         m, seq, static_cast<std::size_t>(m.rank == 0 ? mine : theirs), false);
                   });
    check_each_contains(out, {"threw invalid_argument", "collective #3",
                              strcat("allgather of ", mine * 8, " bytes per rank"),
                              strcat("allgather of ", theirs * 8, " bytes per rank")});
  }
}

namespace {

// How member 1 (world rank 11) ends a single-copy operation that member 0 waits in: it
// never comes (member 0's deadline is 300 ms away), marks the segment failed, or aborts
// member 0's segment.
enum class end { never_comes, marks_failed, aborts };

// Checks that member 0's operation (`out[0]`, after `took`) ended as `how` says, its
// timeout naming `late` ("... rank [11] did not ..."), and that member 1 went away.
void check_ended(end how, const std::vector<std::string>& out, duration took,
                 const std::string& late) {
  CHECK(out[1] == "away");
  switch (how) {
    case end::never_comes:
      CHECK(contains(out[0], "threw timeout"));
      CHECK(contains(out[0], late));
      CHECK(took >= 300ms);
      break;
    case end::marks_failed:
      CHECK(contains(out[0], "threw connection_lost"));
      CHECK(contains(out[0], "rank 11 failed"));
      break;
    case end::aborts:
      CHECK(contains(out[0], "threw aborted"));
      break;
  }
  CHECK(took < 3s);
}

}  // namespace

TEST_CASE(
    "an allgather read from the others' memory ends as the slots' do when a member never "
    "comes, fails, or its group aborts") {
  for (bool pipes : {true, false})
    for (end how : {end::never_comes, end::marks_failed, end::aborts}) {
      CAPTURE(pipes);
      CAPTURE(static_cast<int>(how));
      duration took{};
      auto group = group_of(2, {10, 11}).with_slot(gloo_shm::default_slot_bytes);
      auto out = on_members(pipes ? group : group.without_pipes(), [&](member& m) -> std::string {
        if (m.rank == 1) {
          std::this_thread::sleep_for(100ms);
          if (how == end::marks_failed) m.seg.mark_failed();
          if (how == end::aborts) m.all[0]->abort();
          return "away";
        }
        std::vector<std::int64_t> own(8192), all(16384);
        const auto start = clock::now();
        auto r =
            m.seg.allgather(1, tensor_view::of(std::span(own)), tensor_view::of(std::span(all)),
                            in(how == end::never_comes ? 300ms : 20s));
        took = std::chrono::duration_cast<duration>(clock::now() - start);
        must(std::move(r));
        return "";
      });
      CAPTURE(out[0]);
      check_ended(how, out, took,
                  "allgather of 65536 bytes per rank (collective #1): rank [11] did not "
                  "contribute in time");
    }
}

namespace {

// Two members that never copy once: a broadcast over 256 KiB goes through the slots (4 KiB
// each, so in many chunks) whether or not the members can all run at once.
setup slots_only() { return group_of(2, {10, 11}).with_single_copy(single_copy_mode::off); }

}  // namespace

TEST_CASE(
    "a broadcast copied once or through the slots, or an allgather copied once, of tensors "
    "in ordinary or shared host memory, ends as a small allgather does when a member never "
    "comes, fails, or its group aborts") {
  enum class op {
    broadcast_reads,
    broadcast_pipes,
    broadcast_slots,
    allgather_writes,
    allgather_reads
  };
  for (op which : {op::broadcast_reads, op::broadcast_pipes, op::broadcast_slots,
                   op::allgather_writes, op::allgather_reads})
    for (end how : {end::never_comes, end::marks_failed, end::aborts})
      for (int root : {0, 1})
        for (memory where : {memory::plain, memory::shared}) {
          // Allgathers have no root.
          if ((which == op::allgather_writes || which == op::allgather_reads) && root == 1)
            continue;
          // Shared host memory changes only how the members copy once from one another.
          if (where == memory::shared &&
              (which == op::broadcast_pipes || which == op::broadcast_slots))
            continue;
          CAPTURE(static_cast<int>(which));
          CAPTURE(where == memory::shared);
          CAPTURE(static_cast<int>(how));
          CAPTURE(root);
          duration took{};
          auto group = group_of(2, {10, 11}).with_slot(gloo_shm::default_slot_bytes);
          if (which == op::broadcast_pipes) group = group.without_reads();
          if (which == op::broadcast_slots) group = slots_only();
          auto out = on_members(group, [&](member& m) -> std::string {
            // 1 MiB: several pieces of the pipes, many chunks of the slots. Allgathers that
            // read: 128 KiB per member, through the pipes, or after the first through the
            // members' mappings of one another's shared inputs.
            const std::size_t count = which == op::allgather_reads ? 1 << 15 : 1 << 18;
            elements<float> data(count, 0.0f, where), all(2 * count, 0.0f, where);
            auto run = [&](std::uint64_t seq, clock::time_point deadline) {
              return which == op::allgather_writes || which == op::allgather_reads
                         ? m.seg.allgather(seq, tensor_view::of(data.span()),
                                           tensor_view::of(all.span()), deadline)
                         : m.seg.broadcast(seq, tensor_view::of(data.span()), root, deadline);
            };
            // A first one together: the members learn that they can read one another (one
            // wait more, at the first such operation only); the second is the one that ends.
            must(run(1, in(10s)));
            if (m.rank == 1) {
              std::this_thread::sleep_for(100ms);
              if (how == end::marks_failed) m.seg.mark_failed();
              if (how == end::aborts) m.all[0]->abort();
              return "away";
            }
            const auto start = clock::now();
            auto r = run(2, in(how == end::never_comes ? 300ms : 20s));
            took = std::chrono::duration_cast<duration>(clock::now() - start);
            must(std::move(r));
            return "";
          });
          CAPTURE(out[0]);
          check_ended(how, out, took,
                      which == op::broadcast_slots
                          ? "(collective #2): rank [11] did not arrive in time"
                          : "(collective #2): rank [11] ");
        }
}

TEST_CASE(
    "members that disagree on the size or the root of a broadcast copied once fail naming "
    "both") {
  for (bool reads : {true, false}) {
    CAPTURE(reads);
    auto group = group_of(2, {10, 11}).with_slot(gloo_shm::default_slot_bytes);
    if (!reads) group = group.without_reads();
    // Both copied once, and one copied once against one through the ring.
    for (auto [mine, theirs] : {std::pair{65536, 100000}, std::pair{16384, 10000}}) {
      CAPTURE(theirs);
      auto sizes = on_members(group, [&](member& m) {
        std::uint64_t seq = 3;
        return float_broadcast(m, seq, static_cast<std::size_t>(m.rank == 0 ? mine : theirs), 0, 0);
      });
      check_each_contains(sizes,
                          {"threw invalid_argument", strcat("broadcast of ", mine * 4, " bytes"),
                           strcat("broadcast of ", theirs * 4, " bytes")});
    }
    // Member 0's buffer in shared host memory or not: a flag beside the root in its
    // description, which the comparison leaves out and the message too.
    for (memory where : {memory::plain, memory::shared}) {
      CAPTURE(where == memory::shared);
      auto roots = on_members(group, [&](member& m) {
        std::uint64_t seq = 4;
        return float_broadcast(m, seq, 65536, 1 - m.rank, 0, m.rank == 0 ? where : memory::plain);
      });
      check_each_contains(roots, {"threw invalid_argument", "broadcast of 262144 bytes from rank 0",
                                  "broadcast of 262144 bytes from rank 1"});
    }
  }
}

TEST_CASE(
    "members that disagree on the size or the root of a broadcast through the slots fail "
    "naming both, and none takes the other's data") {
  // One chunk more, and many fewer.
  for (std::size_t theirs : {71024, 66000}) {
    CAPTURE(theirs);
    auto sizes = on_members(slots_only(), [&](member& m) {
      std::uint64_t seq = 3;
      return float_broadcast(m, seq, m.rank == 0 ? 70000 : theirs, 0, 0);
    });
    check_each_contains(sizes, {"threw invalid_argument", "broadcast of 280000 bytes",
                                strcat("broadcast of ", theirs * 4, " bytes")});
  }
  // Each takes itself, or the other, for the root.
  for (bool itself : {true, false}) {
    CAPTURE(itself);
    std::vector<std::vector<float>> got(2);
    auto roots = on_members(slots_only(), [&](member& m) {
      std::vector<float> v(70000, static_cast<float>(m.rank));
      auto r =
          m.seg.broadcast(4, tensor_view::of(std::span(v)), itself ? m.rank : 1 - m.rank, in(10s));
      got[static_cast<std::size_t>(m.rank)] = v;
      must(std::move(r));
      return std::string();
    });
    check_each_contains(roots, {"threw invalid_argument", "broadcast of 280000 bytes from rank 0",
                                "broadcast of 280000 bytes from rank 1"});
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto& v = got[static_cast<std::size_t>(r)];
      CHECK(std::count(v.begin(), v.end(), static_cast<float>(r)) == 70000);
    }
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
      must(m.seg.allreduce(1, tensor_view::of(std::span(v)), reduce_op::sum,
                           *cpu_reduce(dtype::float32, reduce_op::sum), 1, in(20s)));
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
      must(m.seg.allreduce(1, tensor_view::of(std::span(v)), reduce_op::sum, fn, 1, in(20s)));
    } catch (const troupe::exception& e) {
      took = std::chrono::duration_cast<duration>(clock::now() - start);
      try {
        must(m.seg.broadcast(2, tensor_view::of(std::span(v)), 0, in(20s)));
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

TEST_CASE(
    "one member that turns shared memory off leaves every member without a segment and "
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

TEST_CASE(
    "rank 0 whose members never answer gets an error within the timeout and leaves nothing "
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

namespace {

bool shm_exists(const std::string& name) { return std::filesystem::exists("/dev/shm/" + name); }

// Creates the empty segment "/dev/shm/<name>" as a killed rank 0 would have left it.
void leave_segment(const std::string& name) {
  int fd = ::shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE_MESSAGE(fd >= 0, "shm_open(/", name, ") failed");
  ::close(fd);
}

}  // namespace

TEST_CASE("a segment name says who made it, and other names are not taken for one") {
  auto name = gloo_shm::segment_name(0xabc);
  REQUIRE(name.front() == '/');
  auto maker = gloo_shm::parse_segment_name(name.substr(1));
  REQUIRE(maker.has_value());
  CHECK(maker->pid == ::getpid());
  CHECK(maker->start == gloo_shm::read_proc(::getpid())->start);
  CHECK(maker->pid_ns == gloo_shm::pid_namespace());
  for (std::string other : {"troupe-12-abc", "troupe-1-2-3", "troupe-x-1-2-3", "troupe-1-2-3-4-5",
                            "other-1-2-3-4", "troupe-0-1-2-3", "troupe-1-2-3-", "troupe-1-2-3-4.0",
                            "troupe-1-2-3-4.0.x", "troupe-1-2-3-4.0.1.2", "troupe-1-2-3-4..1"})
    CHECK_MESSAGE(!gloo_shm::parse_segment_name(other).has_value(), other);
  // The segment's pipes say who made them too.
  auto pipe = gloo_shm::pipe_path(name, 1, 0);
  REQUIRE(pipe.rfind("/dev/shm/", 0) == 0);
  auto pipe_maker = gloo_shm::parse_segment_name(pipe.substr(9));
  REQUIRE(pipe_maker.has_value());
  CHECK(pipe_maker->pid == ::getpid());
  CHECK(pipe_maker->start == maker->start);
}

TEST_CASE(
    "a segment left by a rank 0 killed during creation is removed by the next group on the "
    "host, and no other name is touched") {
  const auto ns = gloo_shm::pid_namespace();
  REQUIRE(ns != 0);
  auto child = troupe::test::child_process::start_forked([] {
    for (int i = 0; i < 600; ++i) ::usleep(100000);  // at most a minute; killed below
    return 0;
  });
  REQUIRE(child.start_error().empty());
  const int pid = child.pid();
  auto state = gloo_shm::read_proc(pid);
  REQUIRE(state.has_value());
  const auto tag = strcat(::getpid());  // keeps parallel runs of this test apart (hex digits)
  auto named = [&](int p, std::uint64_t start, std::uint64_t pid_ns, const std::string& token) {
    return strcat("troupe-", p, "-", start, "-", pid_ns, "-", token);
  };
  // The live child's own segment; one whose start time is not the child's (its pid reused);
  // one of another pid namespace; one of another form.
  const auto live = named(pid, state->start, ns, strcat("a", tag));
  const auto reused = named(pid, state->start + 1, ns, strcat("b", tag));
  const auto foreign = named(pid, state->start, ns + 1, strcat("c", tag));
  const auto odd = strcat("troupe-", tag, "t-odd");
  struct unlink_all {  // on every way out of the test
    std::vector<std::string> names;
    ~unlink_all() {
      for (const auto& n : names) ::shm_unlink(("/" + n).c_str());
    }
  } cleanup{{live, reused, foreign, odd, live + ".0.1", reused + ".1.0"}};
  for (const auto& n : {live, reused, foreign, odd}) leave_segment(n);
  // And the pipes such a rank 0 made with its segment.
  for (const auto& n : {live + ".0.1", reused + ".1.0"})
    REQUIRE_MESSAGE(::mkfifo(("/dev/shm/" + n).c_str(), 0600) == 0, "mkfifo(", n, ") failed");
  gloo_shm::sweep_dead_segments();
  CHECK(shm_exists(live));
  CHECK(shm_exists(live + ".0.1"));
  CHECK_FALSE(shm_exists(reused));
  CHECK_FALSE(shm_exists(reused + ".1.0"));
  CHECK(shm_exists(foreign));
  CHECK(shm_exists(odd));

  // The child dies: the next group's rank 0 removes its name while opening its segment.
  child.stop();
  REQUIRE(child.exited());
  check_all(on_members(group_of(2), [](member&) { return ""; }));
  CHECK_FALSE(shm_exists(live));
  CHECK_FALSE(shm_exists(live + ".0.1"));
  CHECK(shm_exists(foreign));
  CHECK(shm_exists(odd));
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

TEST_CASE(
    "TROUPE_GLOO_SHM=0 turns shared memory off, TROUPE_GLOO_SHM_SLOT sets the slot size and "
    "TROUPE_GLOO_SHM_SINGLE_COPY says whether allgathers read the others' memory: 0 never, 1 "
    "always, auto (the default) when measured to be faster") {
  auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto shm = saved("TROUPE_GLOO_SHM"), slot = saved("TROUPE_GLOO_SHM_SLOT"),
             single = saved("TROUPE_GLOO_SHM_SINGLE_COPY");
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v)
      ::setenv(name, v->c_str(), 1);
    else
      ::unsetenv(name);
  };
  ::setenv("TROUPE_GLOO_SHM", "0", 1);
  ::setenv("TROUPE_GLOO_SHM_SLOT", "65536", 1);
  ::setenv("TROUPE_GLOO_SHM_SINGLE_COPY", "1", 1);
  open_options a;
  CHECK(a.single_copy == single_copy_mode::measured);  // the default
  gloo_shm::apply_env(a);
  CHECK_FALSE(a.enabled);
  CHECK(a.slot_bytes == 65536);
  CHECK(a.single_copy == single_copy_mode::always);
  ::setenv("TROUPE_GLOO_SHM_SINGLE_COPY", "0", 1);
  gloo_shm::apply_env(a);
  CHECK(a.single_copy == single_copy_mode::off);
  ::setenv("TROUPE_GLOO_SHM_SINGLE_COPY", "auto", 1);
  gloo_shm::apply_env(a);
  CHECK(a.single_copy == single_copy_mode::measured);
  ::setenv("TROUPE_GLOO_SHM", "1", 1);
  ::setenv("TROUPE_GLOO_SHM_SLOT", "64k", 1);
  ::setenv("TROUPE_GLOO_SHM_SINGLE_COPY", "yes please", 1);
  open_options b;
  b.single_copy = single_copy_mode::off;
  gloo_shm::apply_env(b);
  CHECK(b.enabled);
  CHECK(b.slot_bytes == gloo_shm::default_slot_bytes);
  CHECK(b.single_copy == single_copy_mode::measured);  // neither: auto, with a warning
  restore("TROUPE_GLOO_SHM", shm);
  restore("TROUPE_GLOO_SHM_SLOT", slot);
  restore("TROUPE_GLOO_SHM_SINGLE_COPY", single);
}
