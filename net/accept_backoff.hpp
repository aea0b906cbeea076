// accept_backoff: what an accept loop does when accept() fails (EMFILE, ENFILE, ENOMEM):
// wait before the next try, 10 ms doubling to 1 s, and log at most once a second with the
// count of failures, instead of retrying at once (a core at 100% and a flood of log lines)
// or giving up (a server that never accepts again). Connections already open are served
// meanwhile; the loop accepts again by itself once descriptors are free. Used by the RPC
// agent's listeners and the TCP store server.
// Used by one accept loop, whose handlers never run concurrently.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <string>

namespace troupe::net {

class accept_backoff {
 public:
  /// `component` is the log component ("rpc", "store"); `who` starts each log line (the
  /// listener, e.g. "rpc (local socket)" or the store server's name).
  accept_backoff(boost::asio::io_context& io, std::string component, std::string who);

  /// After a successful accept: the next failure starts again at 10 ms.
  void succeeded() noexcept { delay_ = std::chrono::milliseconds(0); }

  /// After a failed accept: false when there is nothing to retry (the listener was
  /// closed: bad_descriptor or operation_aborted); otherwise logs (at most once a second)
  /// and runs `again` after the pause, unless cancel() or the io_context's end comes first.
  bool retry_after_failure(const boost::system::error_code& ec, std::function<void()> again);

  /// Drops a pending retry. On the loop's thread.
  void cancel();

 private:
  boost::asio::steady_timer timer_;
  std::string component_;
  std::string who_;
  std::chrono::milliseconds delay_{0};
  std::size_t failures_ = 0;
  std::chrono::steady_clock::time_point last_log_{};
};

}  // namespace troupe::net
