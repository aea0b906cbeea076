// DDP with real rank processes on 127.0.0.1: the parent hosts a TCP store on port 0 and
// starts one training_test_worker per rank.
#include <doctest/doctest.h>

#include "../collectives/rank_processes.hpp"

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

namespace {

void run_ranks(const std::string& scenario, int world) {
  run_rank_processes(TROUPE_TRAINING_TEST_WORKER, scenario, world, 40s);
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
