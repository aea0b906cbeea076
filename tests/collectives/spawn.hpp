// Child processes for the multi-process collective tests: start rank processes, wait for
// them with a deadline (stragglers are killed), and read their exit status. The names the
// suites use, over the shared helper (support/child_process.hpp).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <troupe/store/store.hpp>
#include "support/child_process.hpp"

namespace troupe::collectives::testing {

// Starts `args` (args[0] is the program); -1 when it could not be started.
inline pid_t start_process(const std::vector<std::string>& args) {
  return troupe::test::spawn_process(args, {});
}

// Waits for each child until `timeout` in total; children still running then are killed
// and reported as -1.
inline std::map<pid_t, int> wait_children(const std::vector<pid_t>& pids,
                                          std::chrono::milliseconds timeout) {
  return troupe::test::wait_processes(pids, timeout);
}

using troupe::test::exited_zero;

// Waits until the store's counter `key`, to which each rank adds 1 when it gets somewhere
// (e.g. into its operation loop), reaches `ranks`: polls every 50 ms for up to 20 s. True
// when it did.
inline bool every_rank_counted(troupe::store& s, const std::string& key, int ranks) {
  for (int i = 0; i < 400; ++i) {
    auto n = s.add(key, 0);
    if (!n) return false;
    if (*n == ranks) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace troupe::collectives::testing
