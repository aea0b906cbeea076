// DDP with real rank processes on 127.0.0.1: the parent hosts a TCP store on port 0 and
// starts one training_test_worker per rank.
#include <doctest/doctest.h>

#include "../collectives/spawn.hpp"
#include "store/tcp_store_server.hpp"

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

namespace {

void run_ranks(const std::string& scenario, int world) {
  auto server = troupe::tcp_store_server::start({}).value();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(start_process({TROUPE_TRAINING_TEST_WORKER, scenario, server->url(),
                                  std::to_string(r), std::to_string(world)}));
    REQUIRE(pids.back() > 0);
  }
  for (auto& [pid, st] : wait_children(pids, 40s)) {
    CAPTURE(pid);
    CHECK(exited_zero(st));
  }
}

}  // namespace

TEST_CASE("rank processes training with uneven shards under join match one process") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    run_ranks("equivalence", world);
  }
}

TEST_CASE("rank processes accumulate under no_sync and average the sum") {
  run_ranks("no_sync", 4);
}

TEST_CASE("rank processes reduce buckets through every comm hook") { run_ranks("hooks", 4); }

TEST_CASE("rank processes average their weights on the period after warm-up") {
  run_ranks("averaging", 4);
}
