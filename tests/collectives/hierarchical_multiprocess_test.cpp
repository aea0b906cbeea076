// The hierarchical allreduce of the gloo backend, in real rank processes on 127.0.0.1 that
// claim simulated hosts (TROUPE_GLOO_HOST_KEY, set by each collectives_test_worker): the
// group sees two hosts of two ranks each and takes the path across hosts on one machine.
#include <doctest/doctest.h>

#include <thread>

#include "rank_processes.hpp"
#include "spawn.hpp"
#include "store/connect.hpp"
#include "store/tcp_store_server.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

}  // namespace

TEST_CASE("an allreduce across two simulated hosts of two ranks matches local results bit for "
          "bit on every rank") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_blocks", 4, 80s);
}

TEST_CASE("an allreduce across simulated hosts whose ranks interleave matches local results") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_interleaved", 4, 80s);
}

TEST_CASE("an allreduce across simulated hosts of two and one ranks matches local results") {
  run_rank_processes(TROUPE_COLLECTIVES_TEST_WORKER, "hier_blocks", 3, 80s);
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
  bool all_in = false;
  for (int i = 0; i < 400 && !all_in; ++i) {
    auto n = s->add("looping", 0);
    REQUIRE(n.has_value());
    all_in = *n == world;
    if (!all_in) std::this_thread::sleep_for(50ms);
  }
  REQUIRE(all_in);
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
