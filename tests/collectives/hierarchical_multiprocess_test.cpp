// The hierarchical allreduce of the gloo backend, in real rank processes on 127.0.0.1 that
// claim simulated hosts (TROUPE_GLOO_HOST_KEY, set by each collectives_test_worker): the
// group sees two hosts of two ranks each and takes the path across hosts on one machine.
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include <troupe/collectives/gloo/hierarchical.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "rank_processes.hpp"
#include "spawn.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;
using troupe::collectives::gloo_hier::host_layout;

}  // namespace

TEST_CASE("hosts are numbered by their lowest rank and their members by rank on every member") {
  const std::vector<std::string> keys{"b", "a", "b", "a"};
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    auto l = host_layout::from_keys(keys, rank);
    CHECK(l.hosts == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
    CHECK(l.host == rank % 2);
    CHECK(l.local_rank == rank / 2);
    CHECK(l.local_size() == 2);
    CHECK(l.slices() == 2);
    CHECK(l.balanced());
    CHECK(l.worthwhile());
    CHECK(l.slice_members(0) == std::vector<int>{0, 1});
    CHECK(l.slice_members(1) == std::vector<int>{2, 3});
  }
}

TEST_CASE("hosts of different sizes cut a tensor into as many slices as the smallest has members") {
  auto l = host_layout::from_keys(std::vector<std::string>{"a", "a", "a", "b"}, 3);
  CHECK(l.host == 1);
  CHECK(l.local_rank == 0);
  CHECK(l.local_size() == 1);
  CHECK(l.slices() == 1);
  CHECK_FALSE(l.balanced());
  CHECK(l.worthwhile());
  CHECK(l.slice_members(0) == std::vector<int>{0, 3});
}

TEST_CASE("a group on one host or with one member per host does not take the hierarchical path") {
  CHECK_FALSE(host_layout::from_keys(std::vector<std::string>{"a", "a", "a"}, 1).worthwhile());
  CHECK_FALSE(host_layout::from_keys(std::vector<std::string>{"a", "b", "c"}, 2).worthwhile());
}

TEST_CASE(
    "an allreduce across two simulated hosts of two ranks matches local results bit for "
    "bit on every rank") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_blocks", 4, 80s);
}

TEST_CASE("an allreduce across simulated hosts whose ranks interleave matches local results") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_interleaved", 4, 80s);
}

TEST_CASE("an allreduce across simulated hosts of two and one ranks matches local results") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_blocks", 3, 80s);
}

TEST_CASE("an allreduce across three simulated hosts of two ranks matches local results") {
  // Two hosts connect a link per slice; three take the direct algorithms across hosts.
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_blocks", 6, 80s);
}

TEST_CASE("killing a rank in a hierarchical allreduce fails the survivors in time naming it") {
  constexpr int world = 4;
  auto server = troupe::tcp_store_server::start({}).value();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(start_process({TROUPE_COLLECTIVES_TEST_WORKER, "hier_kill", server->url(),
                                  std::to_string(r), std::to_string(world)}));
    REQUIRE(pids.back() > 0);
  }
  troupe::store_options so;
  so.timeout = 20s;
  auto s = troupe::connect_store(server->url(), so).value();
  // Wait until every rank is inside its allreduce loop, then kill the last one.
  REQUIRE(every_rank_counted(*s, "looping", world));
  std::this_thread::sleep_for(200ms);  // well inside the loop of 16 MiB allreduces
  REQUIRE(::kill(pids.back(), SIGKILL) == 0);
  auto victim = wait_children({pids.back()}, 5s);
  CHECK(WIFSIGNALED(victim[pids.back()]));
  // The survivors check the time and the error themselves, then regroup as three ranks
  // on two simulated hosts.
  for (auto& [pid, st] : wait_children({pids.begin(), pids.end() - 1}, 40s)) {
    CAPTURE(pid);
    CHECK(exited_zero(st));
  }
}
