#include <troupe/rpc/detail/rref_table.hpp>

namespace troupe::rpc::detail {

void rref_table::created(std::uint64_t id, const std::string& creator) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& e = entries_[id];
  e.shares.emplace(0, creator);
  e.parked_since.reset();
}

rref_table::answers rref_table::set_value(std::uint64_t id, const expected<wire::frame>& value) {
  answers waiters;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return waiters;
  auto& e = it->second;
  e.ready = true;
  e.value = value;
  waiters.swap(e.waiters);
  return waiters;
}

void rref_table::add_share(std::uint64_t id, std::uint64_t fork, std::string holder) {
  std::lock_guard<std::mutex> lk(mu_);
  if (early_releases_.erase({id, fork}) > 0) return;
  // Normally the entry exists (the sender's own share keeps it); an add that overtook the
  // creating request makes it, not ready yet.
  auto& e = entries_[id];
  e.shares.emplace(fork, std::move(holder));
  e.parked_since.reset();
}

void rref_table::release(std::uint64_t id, std::uint64_t fork) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.shares.erase(fork) == 0) early_releases_.emplace(id, fork);
  if (it != entries_.end() && it->second.shares.empty()) entries_.erase(it);
}

std::optional<expected<wire::frame>> rref_table::fetch(std::uint64_t id, waiter w) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    auto& e = entries_[id];
    e.parked_since = clock::now();
    e.waiters.push_back(std::move(w));
    has_parked_.store(true);
    return std::nullopt;
  }
  if (!it->second.ready) {
    it->second.waiters.push_back(std::move(w));
    return std::nullopt;
  }
  return *it->second.value;
}

std::vector<std::pair<std::uint64_t, rref_table::answers>> rref_table::expire_parked(
    clock::time_point now, duration limit) {
  std::vector<std::pair<std::uint64_t, answers>> expired;
  if (!has_parked_.load()) return expired;
  std::lock_guard<std::mutex> lk(mu_);
  bool still_parked = false;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& e = it->second;
    if (e.parked_since && e.shares.empty() && now - *e.parked_since >= limit) {
      expired.emplace_back(it->first, std::move(e.waiters));
      it = entries_.erase(it);
      continue;
    }
    still_parked = still_parked || (e.parked_since && e.shares.empty());
    ++it;
  }
  has_parked_.store(still_parked);
  return expired;
}

std::pair<std::size_t, std::size_t> rref_table::drop_shares_of(const std::string& worker) {
  std::size_t dropped = 0, freed = 0;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& shares = it->second.shares;
    dropped += std::erase_if(shares, [&](const auto& s) { return s.second == worker; });
    if (shares.empty() && !it->second.parked_since) {
      it = entries_.erase(it);
      ++freed;
    } else {
      ++it;
    }
  }
  return {dropped, freed};
}

std::size_t rref_table::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return entries_.size();
}

}  // namespace troupe::rpc::detail
