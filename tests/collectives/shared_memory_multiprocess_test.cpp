// The gloo backend's shared-memory segment between two processes: this process and a
// child forked from it open a segment of two through a real TCP store on 127.0.0.1 (port
// 0), then the child goes away without joining the collective. The child is forked while
// this process has one thread only (before the store server starts), and learns the
// store's address through a pipe.
#include <doctest/doctest.h>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>
#include <troupe/collectives/gloo/shared_memory.hpp>
#include <troupe/collectives/shared_host_memory.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using troupe::collectives::gloo_shm::open_options;
using troupe::collectives::gloo_shm::segment;
using troupe::collectives::gloo_shm::single_copy_mode;

namespace {

// What the child does once it opened the segment.
enum class child_end { exit_at_once, killed_later, allgathers, shared_allgathers };
// What the parent runs: an allreduce, an allgather of 64 KiB per member, which two
// processes that can run at once read from each other's memory, or one of 512 KiB per
// member of tensors in shared host memory, which they write into each other's outputs
// through their mappings of them.
enum class parent_op { allreduce, allgather, shared_allgather };
constexpr std::size_t allgather_count = 8192;          // int64 elements per member
constexpr std::size_t shared_allgather_count = 65536;  // the same, in shared host memory

std::int64_t gathered_value(int rank, std::size_t i) {
  return static_cast<std::int64_t>(rank) * 1000003 + static_cast<std::int64_t>(i) * 7 - 5;
}

// Runs the allgather as `rank` of two: its error, or one naming a block that did not arrive
// intact.
expected<void> run_allgather(segment& seg, int rank, clock::time_point deadline,
                             bool shared = false) {
  const std::size_t count = shared ? shared_allgather_count : allgather_count;
  std::vector<std::int64_t> own_plain, all_plain;
  std::span<std::int64_t> own, all;
  tensor own_shared, all_shared;
  if (shared) {
    auto a = shared_host_tensor(dtype::int64, {static_cast<std::int64_t>(count)});
    auto b = shared_host_tensor(dtype::int64, {static_cast<std::int64_t>(2 * count)});
    if (!a) return std::move(a).error();
    if (!b) return std::move(b).error();
    own_shared = std::move(*a);
    all_shared = std::move(*b);
    own = own_shared.as_span<std::int64_t>();
    all = all_shared.as_span<std::int64_t>();
  } else {
    own_plain.resize(count);
    all_plain.resize(2 * count);
    own = own_plain;
    all = all_plain;
  }
  std::fill(all.begin(), all.end(), -1);
  for (std::size_t i = 0; i < count; ++i) own[i] = gathered_value(rank, i);
  auto r = seg.allgather(1, tensor_view::of(own), tensor_view::of(all), deadline);
  if (!r) return r;
  for (int b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < count; ++i)
      if (all[static_cast<std::size_t>(b) * count + i] != gathered_value(b, i))
        return make_error(errc::internal, "block ", b, " element ", i, " is wrong");
  return ok();
}

open_options member_options(int rank) {
  open_options o;
  o.rank = rank;
  o.size = 2;
  o.world_ranks = {5, 7};
  o.group = "group 'shm-multiprocess-test'";
  o.slot_bytes = 4096;
  o.single_copy =
      single_copy_mode::always;  // the allgathers read each other's memory where they can
  o.timeout = 10s;
  return o;
}

// Whether this process may run on two CPUs or more (the members can then run at once).
bool two_cpus_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  return CPU_COUNT(&set) >= 2;
}

std::size_t threads_of_this_process() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)e;
    ++n;
  }
  return n;
}

// The child: reads the store's URL from `fd`, opens the segment as rank 1, then ends as
// `how` says without calling any operation. Exit status 0 once the segment is open.
[[noreturn]] void run_child(int fd, child_end how) {
  std::string url;
  char buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) ::_exit(2);
    auto n = ::read(fd, buf, sizeof buf);
    if (n < 0) ::_exit(2);
    if (n == 0) break;
    url.append(buf, static_cast<std::size_t>(n));
  }
  auto s = connect_store(url);
  if (!s) ::_exit(3);
  auto seg = segment::open(**s, member_options(1));
  if (!seg || !*seg) ::_exit(4);
  if (how == child_end::killed_later) {
    std::this_thread::sleep_for(300ms);
    ::raise(SIGKILL);
  }
  if (how == child_end::allgathers && !run_allgather(**seg, 1, clock::now() + 30s)) ::_exit(5);
  if (how == child_end::shared_allgathers &&
      (!run_allgather(**seg, 1, clock::now() + 30s, true) ||
       (*seg)->mapped_copies() != (*seg)->single_copy_reads()))
    ::_exit(6);
  ::_exit(0);
}

// Forks the child, starts the store, opens the segment as rank 0 and runs an allreduce
// with a 30 s deadline. Returns the error it threw ("" if none) and how long it took.
// The one fork of the tests outside tests/support/child_process.hpp: these tests need the
// child left unreaped (a zombie) or reaped by the kernel (SIGCHLD ignored) while the
// allreduce runs, which a handle that reaps its child would change.
struct outcome {
  std::string error;
  errc code = errc::internal;
  duration took{};
  pid_t child = -1;
  bool read_memory = false;  // whether the allgather read the other's memory
  std::uint64_t single_copies = 0, mapped_copies = 0, buffers_mapped = 0;
};
outcome run_parent(child_end how, parent_op op = parent_op::allreduce) {
  outcome out;
  REQUIRE(threads_of_this_process() == 1);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  out.child = ::fork();
  REQUIRE(out.child >= 0);
  if (out.child == 0) {
    ::close(fds[1]);
    run_child(fds[0], how);
  }
  ::close(fds[0]);
  auto server = tcp_store_server::start({});
  REQUIRE(server);
  const auto url = (*server)->url();
  REQUIRE(::write(fds[1], url.data(), url.size()) == static_cast<ssize_t>(url.size()));
  ::close(fds[1]);
  auto s = connect_store(url);
  REQUIRE(s);
  auto seg = segment::open(**s, member_options(0));
  REQUIRE(seg);
  REQUIRE(*seg != nullptr);
  const auto start = clock::now();
  expected<void> r;
  if (op != parent_op::allreduce) {
    r = run_allgather(**seg, 0, start + 30s, op == parent_op::shared_allgather);
    out.read_memory = (*seg)->reads_members_memory();
    out.single_copies = (*seg)->single_copy_reads();
    out.mapped_copies = (*seg)->mapped_copies();
    out.buffers_mapped = (*seg)->buffers_mapped();
  } else {
    std::vector<float> v(3000, 1.0f);
    r = (*seg)->allreduce(1, tensor_view::of(std::span(v)), reduce_op::sum,
                          *cpu_reduce(dtype::float32, reduce_op::sum), 1, start + 30s);
  }
  if (!r) {
    out.error = r.error().message();
    out.code = r.error().code();
  }
  out.took = std::chrono::duration_cast<duration>(clock::now() - start);
  return out;
}

}  // namespace

TEST_CASE("a member whose process exited fails the other's allreduce at once naming its rank") {
  auto out = run_parent(child_end::exit_at_once);
  // The child is a zombie until it is reaped here: it no longer runs all the same.
  auto status = testing::wait_children({out.child}, 10s);
  CHECK(testing::exited_zero(status[out.child]));
  CAPTURE(out.error);
  CHECK(out.code == errc::connection_lost);
  CHECK(out.error.find("rank 7 (pid " + std::to_string(out.child) + ") exited") !=
        std::string::npos);
  CHECK(out.error.find("collective #1") != std::string::npos);
  CHECK(out.took < 2s);
}

TEST_CASE("a member process killed while the other waits fails the other's allreduce at once") {
  // The child is reaped as soon as it dies: its /proc entry disappears altogether.
  auto old = ::signal(SIGCHLD, SIG_IGN);
  REQUIRE(reinterpret_cast<void*>(old) != reinterpret_cast<void*>(SIG_ERR));
  auto out = run_parent(child_end::killed_later);
  ::signal(SIGCHLD, old);
  CAPTURE(out.error);
  CHECK(out.code == errc::connection_lost);
  CHECK(out.error.find("rank 7 (pid " + std::to_string(out.child) + ") exited") !=
        std::string::npos);
  CHECK(out.took < 3s);
}

TEST_CASE(
    "two member processes that can run at once allgather by reading each other's memory, "
    "every block intact") {
  auto out = run_parent(child_end::allgathers, parent_op::allgather);
  auto status = testing::wait_children({out.child}, 10s);
  CHECK(testing::exited_zero(status[out.child]));
  CHECK(out.error == "");
  // Two processes of one user, with no Yama or seccomp restriction here (the CI machine's
  // case): the kernel lets them read each other; on one CPU the slots carry the blocks.
  CHECK(out.read_memory == two_cpus_here());
}

TEST_CASE(
    "two member processes allgather tensors in shared host memory by writing into each "
    "other's outputs through their mappings of them, every block intact") {
  auto out = run_parent(child_end::shared_allgathers, parent_op::shared_allgather);
  auto status = testing::wait_children({out.child}, 10s);
  // The child exits 6 when its copy did not go through its mapping of the parent's output.
  CHECK(testing::exited_zero(status[out.child]));
  CHECK(out.error == "");
  // On one CPU the slots carry the blocks, and nothing is mapped.
  const std::uint64_t want = two_cpus_here() ? 1 : 0;
  CHECK(out.single_copies == want);
  CHECK(out.mapped_copies == want);
  CHECK(out.buffers_mapped == want);
}

TEST_CASE("a member whose process exited fails the other's allgather at once naming its rank") {
  auto out = run_parent(child_end::exit_at_once, parent_op::allgather);
  auto status = testing::wait_children({out.child}, 10s);
  CHECK(testing::exited_zero(status[out.child]));
  CAPTURE(out.error);
  CHECK(out.error.find("rank 7 (pid " + std::to_string(out.child) + ") exited") !=
        std::string::npos);
  CHECK(out.error.find("allgather of 65536 bytes per rank") != std::string::npos);
  CHECK(out.took < 2s);
}
