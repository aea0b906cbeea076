#include <troupe/store/key_ledger.hpp>

namespace troupe {

key_ledger::key_ledger(std::shared_ptr<store> base) : base_(std::move(base)) {
  set_timeout(base_->timeout());
}

void key_ledger::note(std::string_view key) {
  std::lock_guard lk(mu_);
  written_.emplace(key);
}

std::vector<std::string> key_ledger::written() const {
  std::lock_guard lk(mu_);
  return {written_.begin(), written_.end()};
}

expected<std::size_t> key_ledger::erase_written(duration timeout) {
  std::size_t existed = 0;
  std::optional<error> first;
  for (const auto& key : written()) {
    auto r = base_->erase(key, timeout);
    if (!r) {
      if (!first) first = std::move(r).error();
      continue;
    }
    if (*r) ++existed;
    std::lock_guard lk(mu_);
    written_.erase(key);
  }
  if (first) return *first;
  return existed;
}

expected<void> key_ledger::set(std::string_view key, std::span<const std::byte> value,
                               duration timeout) {
  note(key);
  return base_->set(key, value, timeout);
}

expected<bytes> key_ledger::get(std::string_view key, duration timeout) {
  return base_->get(key, timeout);
}

expected<bool> key_ledger::check(std::span<const std::string> keys, duration timeout) {
  return base_->check(keys, timeout);
}

expected<std::int64_t> key_ledger::add(std::string_view key, std::int64_t delta, duration timeout) {
  note(key);
  return base_->add(key, delta, timeout);
}

expected<bytes> key_ledger::compare_set(std::string_view key,
                                        const std::optional<bytes>& expected_value,
                                        std::span<const std::byte> desired, duration timeout) {
  note(key);
  return base_->compare_set(key, expected_value, desired, timeout);
}

expected<bool> key_ledger::erase(std::string_view key, duration timeout) {
  auto r = base_->erase(key, timeout);
  if (r) {
    std::lock_guard lk(mu_);
    if (auto it = written_.find(key); it != written_.end()) written_.erase(it);
  }
  return r;
}

expected<void> key_ledger::wait(std::span<const std::string> keys, duration timeout) {
  return base_->wait(keys, timeout);
}

expected<std::int64_t> key_ledger::num_keys(duration timeout) { return base_->num_keys(timeout); }

std::string key_ledger::describe() const { return base_->describe(); }

}  // namespace troupe
