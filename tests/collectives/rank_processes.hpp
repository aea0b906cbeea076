// Rank processes for multi-process tests: a TCP store on 127.0.0.1 (port 0) and one worker
// process per rank, each started as `PROGRAM SCENARIO STORE_URL RANK WORLD`.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include <troupe/store/tcp_store_server.hpp>
#include "spawn.hpp"

namespace troupe::collectives::testing {

/// Runs `scenario` on `world` rank processes of `program` and checks that every one exits
/// with status 0 within `timeout` (stragglers are killed and fail the check).
inline void run_rank_processes(const std::string& program, const std::string& scenario, int world,
                               std::chrono::milliseconds timeout) {
  auto server = troupe::tcp_store_server::start({}).value();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(start_process(
        {program, scenario, server->url(), std::to_string(r), std::to_string(world)}));
    REQUIRE(pids.back() > 0);
  }
  for (auto& [pid, st] : wait_children(pids, timeout)) {
    CAPTURE(pid);
    CHECK(exited_zero(st));
  }
}

}  // namespace troupe::collectives::testing
