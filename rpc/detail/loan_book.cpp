#include <troupe/rpc/detail/loan_book.hpp>

#include <vector>

#include <troupe/core/log.hpp>

namespace troupe::rpc::detail {

std::uint64_t loan_book::next_loan_id() {
  std::lock_guard lk(mu_);
  return ++next_;
}

void loan_book::file_loan(std::uint64_t id, std::shared_ptr<void> keep) {
  const auto now = clock::now();
  (void)expire(now);
  std::lock_guard lk(mu_);
  loans_[id] = loan{std::move(keep), now};
}

bool loan_book::release(std::uint64_t id) {
  std::shared_ptr<void> gone;  // freed outside the lock (it may call into CUDA)
  std::lock_guard lk(mu_);
  auto it = loans_.find(id);
  if (it == loans_.end()) return false;
  gone = std::move(it->second.keep);
  loans_.erase(it);
  return true;
}

std::size_t loan_book::expire(clock::time_point now) {
  std::vector<std::shared_ptr<void>> gone;
  {
    std::lock_guard lk(mu_);
    for (auto it = loans_.begin(); it != loans_.end();) {
      if (now - it->second.filed > expiry_) {
        gone.push_back(std::move(it->second.keep));
        it = loans_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!gone.empty())
    TROUPE_LOG(log_level::warn, "rpc", gone.size(),
               " GPU tensor(s) lent through CUDA IPC were not "
               "released within ",
               format_duration(expiry_),
               "; dropped them (a receiver died or "
               "stalled mid-copy)");
  return gone.size();
}

void loan_book::clear() {
  std::map<std::uint64_t, loan> gone;
  std::lock_guard lk(mu_);
  gone.swap(loans_);
}

std::size_t loan_book::size() const {
  std::lock_guard lk(mu_);
  return loans_.size();
}

}  // namespace troupe::rpc::detail
