#include "rpc/detail/io_loop.hpp"

#include <cstdint>
#include <thread>

namespace troupe::rpc::detail {

namespace {
thread_local std::uint64_t reads = 0;
}

void note_socket_activity() noexcept { ++reads; }

void run_io_loop(boost::asio::io_context& io, std::chrono::microseconds spin) {
  using clock = std::chrono::steady_clock;
  if (spin.count() <= 0) {
    io.run();
    return;
  }
  for (;;) {
    auto before = reads;
    if (io.run_one() == 0) return;  // stopped, or out of work
    if (reads == before) continue;  // a timer or posted work: sleep again when idle
    // A socket was read: stay awake until `spin` passes without another read.
    auto quiet_since = clock::now();
    while (clock::now() - quiet_since < spin) {
      before = reads;
      std::size_t ran = io.poll();
      if (io.stopped()) return;
      if (reads != before)
        quiet_since = clock::now();
      else if (ran == 0)
        std::this_thread::yield();
    }
  }
}

}  // namespace troupe::rpc::detail
