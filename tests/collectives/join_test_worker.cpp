// A rank process for the multi-process Join tests:
//   join_test_worker SCENARIO STORE_URL RANK WORLD
// SCENARIO: uneven, throws. Exits 0 on success; prints the reason and exits 1 otherwise.
#include <iostream>

#include "join_scenarios.hpp"
#include "store/connect.hpp"

using namespace troupe;
using namespace troupe::collectives;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: join_test_worker SCENARIO STORE_URL RANK WORLD\n";
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
  world_options o;
  o.rank = rank;
  o.size = world;
  o.store = std::shared_ptr<store>(std::move(*s));
  o.backend = "gloo";
  o.timeout = 20s;
  auto g = init_world(o);
  if (!g) {
    std::cerr << "rank " << rank << ": " << g.error() << "\n";
    return 1;
  }
  std::string out = scenario == "uneven"   ? testing::join_uneven(**g)
                    : scenario == "throws" ? testing::join_throws(**g)
                                           : "unknown scenario " + scenario;
  if (!out.empty()) {
    std::cerr << "rank " << rank << ": " << out << "\n";
    return 1;
  }
  return 0;
}
