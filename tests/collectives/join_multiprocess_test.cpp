// Join with real rank processes on 127.0.0.1: the parent hosts a TCP store on port 0 and
// starts one join_test_worker per rank.
#include <doctest/doctest.h>

#include "rank_processes.hpp"

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

namespace {

void run_ranks(const std::string& scenario, int world) {
  run_rank_processes(TROUPE_JOIN_TEST_WORKER, scenario, world, 30s);
}

}  // namespace

TEST_CASE("rank processes with uneven inputs all finish with the right hooks at 2 to 4 ranks") {
  for (int world = 2; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks("uneven", world);
  }
}

TEST_CASE("rank processes in throw mode all stop with the join error") { run_ranks("throws", 4); }
