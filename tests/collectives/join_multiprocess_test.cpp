// Join with real rank processes on 127.0.0.1: the parent hosts a TCP store on port 0 and
// starts one join_test_worker per rank.
#include <doctest/doctest.h>

#include "spawn.hpp"
#include "store/tcp_store_server.hpp"

using namespace std::chrono_literals;
using namespace troupe::collectives::testing;

namespace {

void run_ranks(const std::string& scenario, int world) {
  auto server = troupe::tcp_store_server::start({}).value();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(start_process({TROUPE_JOIN_TEST_WORKER, scenario, server->url(),
                                  std::to_string(r), std::to_string(world)}));
    REQUIRE(pids.back() > 0);
  }
  for (auto& [pid, st] : wait_children(pids, 30s)) {
    CAPTURE(pid);
    CHECK(exited_zero(st));
  }
}

}  // namespace

TEST_CASE("rank processes with uneven inputs all finish with the right hooks at 2 to 4 ranks") {
  for (int world = 2; world <= 4; ++world) {
    CAPTURE(world);
    run_ranks("uneven", world);
  }
}

TEST_CASE("rank processes in throw mode all stop with the join error") {
  run_ranks("throws", 4);
}
