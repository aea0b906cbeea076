// A rank process for the multi-process DDP tests:
//   training_test_worker SCENARIO STORE_URL RANK WORLD
// SCENARIO: equivalence, no_sync, hooks, averaging. Exits 0 on success; prints the
// reason and exits 1 otherwise.
#include <iostream>

#include "collectives/group.hpp"
#include "ddp_scenarios.hpp"
#include "store/connect.hpp"

using namespace troupe;
using namespace troupe::training::testing;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: training_test_worker SCENARIO STORE_URL RANK WORLD\n";
    return 2;
  }
  std::string scenario = argv[1];
  int rank = std::stoi(argv[3]), world = std::stoi(argv[4]);
  store_options so;
  so.timeout = 20s;
  so.connect_timeout = 20s;
  auto s = connect_store(argv[2], so);
  if (!s) {
    std::cerr << "rank " << rank << ": " << s.error() << "\n";
    return 1;
  }
  collectives::world_options o;
  o.rank = rank;
  o.size = world;
  o.store = std::shared_ptr<store>(std::move(*s));
  o.backend = "gloo";
  o.timeout = 20s;
  auto g = collectives::init_world(o);
  if (!g) {
    std::cerr << "rank " << rank << ": " << g.error() << "\n";
    return 1;
  }
  std::string out = scenario == "equivalence" ? ddp_matches_single_process(*g)
                     : scenario == "no_sync"  ? ddp_no_sync_accumulates(*g)
                     : scenario == "hooks"    ? ddp_comm_hooks(*g)
                     : scenario == "averaging" ? ddp_model_averaging(*g)
                                               : "unknown scenario " + scenario;
  if (!out.empty()) {
    std::cerr << "rank " << rank << ": " << out << "\n";
    return 1;
  }
  return 0;
}
