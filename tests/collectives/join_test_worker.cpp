// A rank process for the multi-process Join tests:
//   join_test_worker SCENARIO STORE_URL RANK WORLD
// SCENARIO: uneven, throws. Exits 0 on success; prints the reason and exits 1 otherwise.
#include "join_scenarios.hpp"
#include "rank_worker.hpp"

using namespace troupe;
using namespace troupe::collectives;

int main(int argc, char** argv) {
  auto started = testing::rank_worker::start(argc, argv, "join_test_worker");
  if (auto* status = std::get_if<int>(&started)) return *status;
  auto& w = std::get<testing::rank_worker>(started);
  return w.finish(w.scenario == "uneven"   ? testing::join_uneven(*w.group)
                  : w.scenario == "throws" ? testing::join_throws(*w.group)
                                           : "unknown scenario " + w.scenario);
}
