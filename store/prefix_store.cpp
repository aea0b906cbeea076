#include <troupe/store/prefix_store.hpp>

#include <troupe/store/detail/kv_table.hpp>

namespace troupe {

prefix_store::prefix_store(store& base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {
  set_timeout(base.timeout());
}

prefix_store::prefix_store(std::shared_ptr<store> base, std::string prefix)
    : owned_(std::move(base)), base_(*owned_), prefix_(std::move(prefix)) {
  set_timeout(base_.timeout());
}

std::string prefix_store::full_key(std::string_view key) const {
  std::string out;
  out.reserve(prefix_.size() + 1 + key.size());
  out += prefix_;
  out += '/';
  out += key;
  return out;
}

std::vector<std::string> prefix_store::full_keys(std::span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full_key(k));
  return out;
}

std::string prefix_store::describe() const {
  return "prefix '" + prefix_ + "' of " + base_.describe();
}

expected<void> prefix_store::set(std::string_view key, std::span<const std::byte> value,
                                 duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return base_.set(full_key(key), value, timeout);
}

expected<bytes> prefix_store::get(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return base_.get(full_key(key), timeout);
}

expected<bool> prefix_store::check(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  auto full = full_keys(keys);
  return base_.check(full, timeout);
}

expected<std::int64_t> prefix_store::add(std::string_view key, std::int64_t delta,
                                         duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return base_.add(full_key(key), delta, timeout);
}

expected<bytes> prefix_store::compare_set(std::string_view key,
                                          const std::optional<bytes>& expected_value,
                                          std::span<const std::byte> desired, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return base_.compare_set(full_key(key), expected_value, desired, timeout);
}

expected<bool> prefix_store::erase(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return base_.erase(full_key(key), timeout);
}

expected<void> prefix_store::wait(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  auto full = full_keys(keys);
  return base_.wait(full, timeout);
}

expected<std::int64_t> prefix_store::num_keys(duration timeout) {
  return num_keys_with_prefix("", timeout);
}

expected<std::int64_t> prefix_store::num_keys_with_prefix(std::string_view prefix,
                                                          duration timeout) {
  auto* counting = dynamic_cast<prefix_countable*>(&base_);
  if (counting == nullptr)
    return make_error(errc::unsupported, "num_keys on prefix '", prefix_, "': ", base_.describe(),
                      " cannot count keys by prefix, so the keys of this prefix cannot be "
                      "told from the others; count them with keys of your own instead");
  return counting->num_keys_with_prefix(prefix_ + "/" + std::string(prefix), timeout);
}

}  // namespace troupe
