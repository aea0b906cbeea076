// settled_queued_output: the bytes a TCP store server holds for clients that do not read,
// once that figure has stopped moving (unchanged and non-zero for 300 ms; at most 10 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>

#include <troupe/store/tcp_store_server.hpp>

namespace troupe::test {

inline std::size_t settled_queued_output(const tcp_store_server& server) {
  using namespace std::chrono_literals;
  std::size_t last = server.queued_output_bytes();
  auto stable_since = std::chrono::steady_clock::now();
  const auto give_up = stable_since + 10s;
  while (std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(20ms);
    const std::size_t now = server.queued_output_bytes();
    if (now != last || now == 0) {
      last = now;
      stable_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - stable_since > 300ms) {
      break;
    }
  }
  return last;
}

}  // namespace troupe::test
