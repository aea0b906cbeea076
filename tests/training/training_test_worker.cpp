// A rank process for the multi-process DDP tests:
//   training_test_worker SCENARIO STORE_URL RANK WORLD
// SCENARIO: equivalence, no_sync, hooks, averaging. Exits 0 on success; prints the
// reason and exits 1 otherwise.
#include "../collectives/rank_worker.hpp"
#include "ddp_scenarios.hpp"

using namespace troupe;
using namespace troupe::training::testing;

int main(int argc, char** argv) {
  auto started = collectives::testing::rank_worker::start(argc, argv, "training_test_worker");
  if (auto* status = std::get_if<int>(&started)) return *status;
  auto& w = std::get<collectives::testing::rank_worker>(started);
  const auto& g = w.group;
  return w.finish(w.scenario == "equivalence" ? ddp_matches_single_process(g)
                  : w.scenario == "no_sync"   ? ddp_no_sync_accumulates(g)
                  : w.scenario == "hooks"     ? ddp_comm_hooks(g)
                  : w.scenario == "averaging" ? ddp_model_averaging(g)
                                              : "unknown scenario " + w.scenario);
}
