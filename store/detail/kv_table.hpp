// kv_table: the key-value semantics shared by memory_store and the TCP store server, so
// both answer every call in exactly the same way. Not thread-safe; callers lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>

namespace troupe::detail {

/// invalid_argument unless `key` is usable as a store key (non-empty).
expected<void> check_key(std::string_view key);

/// errc::timeout naming the store, the operation, what was awaited and for how long.
error store_timeout(std::string_view store_name, std::string_view operation, std::string_view what,
                    std::chrono::milliseconds waited);

/// "'a', 'b' and 'c'" for error messages; lists at most `limit` keys, then "and N more".
std::string quote_keys(std::span<const std::string> keys, std::size_t limit = 8);

class kv_table {
 public:
  void set(std::string_view key, std::span<const std::byte> value);
  const bytes* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  /// Adds to the decimal integer at `key` (absent: 0); the new value.
  expected<std::int64_t> add(std::string_view key, std::int64_t delta);
  /// See store::compare_set; an absent key with an expected value stores nothing and
  /// returns an empty value.
  bytes compare_set(std::string_view key, const std::optional<bytes>& expected_value,
                    std::span<const std::byte> desired);
  bool erase(std::string_view key);
  std::int64_t size() const { return static_cast<std::int64_t>(map_.size()); }
  /// Keys that start with `prefix`: O(log n + matches), since the map is ordered.
  std::int64_t count_prefix(std::string_view prefix) const;
  /// The keys of `keys` that are absent.
  std::vector<std::string> missing(std::span<const std::string> keys) const;

 private:
  std::map<std::string, bytes, std::less<>> map_;
};

}  // namespace troupe::detail
