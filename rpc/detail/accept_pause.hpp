// accept_pause: what an accept loop does when accept() fails (EMFILE, ENFILE, ENOMEM):
// wait before the next try, 10 ms doubling to 1 s, and log at most once a second with the
// count of failures, instead of retrying at once (a core at 100% and a flood of log lines)
// or giving up (an agent that never accepts again). Connections already open are served
// meanwhile; the loop accepts again by itself once descriptors are free.
// Used by one accept loop, whose handlers never run concurrently.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>

#include <troupe/core/log.hpp>

namespace troupe::rpc::detail {

class accept_pause {
 public:
  explicit accept_pause(boost::asio::io_context& io) : timer_(io) {}

  /// After a successful accept: the next failure starts again at 10 ms.
  void succeeded() { delay_ = std::chrono::milliseconds(0); }

  /// After a failed accept: runs `again` (if it still exists) after the pause.
  void retry_after_failure(const boost::system::error_code& ec, const char* what,
                           std::weak_ptr<std::function<void()>> again) {
    using std::chrono::milliseconds;
    delay_ = std::clamp(delay_ * 2, milliseconds(10), milliseconds(1000));
    ++failures_;
    auto now = std::chrono::steady_clock::now();
    if (now - last_log_ >= std::chrono::seconds(1)) {
      TROUPE_LOG(log_level::warn, "rpc", what, ": accept failed ", failures_,
                 " time(s) since the last report: ", ec.message(), "; retrying in ", delay_.count(),
                 " ms (raise the open-file limit, ulimit -n, if this persists)");
      failures_ = 0;
      last_log_ = now;
    }
    timer_.expires_after(delay_);
    timer_.async_wait([again = std::move(again)](const boost::system::error_code& e) {
      if (e) return;
      if (auto fn = again.lock()) (*fn)();
    });
  }

 private:
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds delay_{0};
  std::size_t failures_ = 0;
  std::chrono::steady_clock::time_point last_log_{};
};

}  // namespace troupe::rpc::detail
