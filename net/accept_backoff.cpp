#include <troupe/net/accept_backoff.hpp>

#include <algorithm>

#include <troupe/core/log.hpp>

namespace troupe::net {

accept_backoff::accept_backoff(boost::asio::io_context& io, std::string component, std::string who)
    : timer_(io), component_(std::move(component)), who_(std::move(who)) {}

bool accept_backoff::retry_after_failure(const boost::system::error_code& ec,
                                         std::function<void()> again) {
  namespace error = boost::asio::error;
  if (ec == error::bad_descriptor || ec == error::operation_aborted) return false;
  using std::chrono::milliseconds;
  delay_ = std::clamp(delay_ * 2, milliseconds(10), milliseconds(1000));
  ++failures_;
  auto now = std::chrono::steady_clock::now();
  if (now - last_log_ >= std::chrono::seconds(1)) {
    TROUPE_LOG(log_level::warn, component_, who_, ": accept failed ", failures_,
               " time(s) since the last report: ", ec.message(), "; retrying in ", delay_.count(),
               " ms (raise the open-file limit, ulimit -n, if this persists)");
    failures_ = 0;
    last_log_ = now;
  }
  timer_.expires_after(delay_);
  timer_.async_wait([again = std::move(again)](const boost::system::error_code& e) {
    if (!e) again();
  });
  return true;
}

void accept_backoff::cancel() { timer_.cancel(); }

}  // namespace troupe::net
