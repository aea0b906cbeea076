// The start of a rank process of the multi-process tests (rank_processes.hpp), started as
// `PROGRAM SCENARIO STORE_URL RANK WORLD`: the arguments and the gloo world group.
#pragma once

#include <iostream>
#include <memory>
#include <string>
#include <variant>

#include <troupe/collectives/group.hpp>
#include <troupe/store/connect.hpp>

namespace troupe::collectives::testing {

struct rank_worker {
  std::string scenario;
  int rank = 0;
  int world = 0;
  std::shared_ptr<process_group> group;

  /// Parses the arguments and joins the world through the store (20 s timeouts). Prints
  /// the usage or the reason and returns the exit status (2: usage, 1: no group) on error.
  static std::variant<rank_worker, int> start(int argc, char** argv, const char* program) {
    if (argc != 5) {
      std::cerr << "usage: " << program << " SCENARIO STORE_URL RANK WORLD\n";
      return 2;
    }
    rank_worker w;
    w.scenario = argv[1];
    w.rank = std::stoi(argv[3]);
    w.world = std::stoi(argv[4]);
    store_options so;
    so.timeout = std::chrono::seconds(20);
    so.connect_timeout = std::chrono::seconds(20);
    auto s = connect_store(argv[2], so);
    if (!s) {
      std::cerr << "rank " << w.rank << ": " << s.error() << "\n";
      return 1;
    }
    world_options o;
    o.rank = w.rank;
    o.size = w.world;
    o.store = std::shared_ptr<store>(std::move(*s));
    o.backend = "gloo";
    o.timeout = std::chrono::seconds(20);
    auto g = init_world(o);
    if (!g) {
      std::cerr << "rank " << w.rank << ": " << g.error() << "\n";
      return 1;
    }
    w.group = std::move(*g);
    return w;
  }

  /// The exit status for a scenario's message ("" is success; otherwise printed).
  int finish(const std::string& out) const {
    if (out.empty()) return 0;
    std::cerr << "rank " << rank << ": " << out << "\n";
    return 1;
  }
};

}  // namespace troupe::collectives::testing
