// prefix_store: a decorator that puts every key under "prefix/", so rounds, epochs and
// groups can share one store without their keys colliding.
//
// num_keys() counts only the keys under this prefix. That needs the underlying store to
// be prefix_countable (memory_store, tcp_store and nested prefix_stores are); the cost is
// the backend's prefix walk, O(log n + keys under the prefix) for the ordered maps of the
// in-process and TCP stores, done in one round trip. Without that capability num_keys
// fails with errc::unsupported rather than return a count that includes other prefixes.
#pragma once

#include <memory>
#include <string>

#include <troupe/store/prefix_count.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

class prefix_store final : public store, public prefix_countable {
 public:
  /// Uses `base` without owning it; `base` must outlive this store.
  prefix_store(store& base, std::string prefix);
  /// Shares ownership of `base`.
  prefix_store(std::shared_ptr<store> base, std::string prefix);

  const std::string& prefix() const noexcept { return prefix_; }
  /// The key as the underlying store sees it: "prefix/key".
  std::string full_key(std::string_view key) const;

  using store::add;
  using store::get;
  using store::set;
  using store::wait;

  expected<void> set(std::string_view key, std::span<const std::byte> value,
                     duration timeout) override;
  expected<bytes> get(std::string_view key, duration timeout) override;
  expected<bool> check(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> add(std::string_view key, std::int64_t delta, duration timeout) override;
  expected<bytes> compare_set(std::string_view key, const std::optional<bytes>& expected_value,
                              std::span<const std::byte> desired, duration timeout) override;
  expected<bool> erase(std::string_view key, duration timeout) override;
  expected<void> wait(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> num_keys(duration timeout) override;
  expected<std::int64_t> num_keys_with_prefix(std::string_view prefix, duration timeout) override;
  std::string describe() const override;

 private:
  std::vector<std::string> full_keys(std::span<const std::string> keys) const;
  std::shared_ptr<store> owned_;
  store& base_;
  std::string prefix_;
};

}  // namespace troupe
