// prefix_countable: an optional capability of a store, counting the keys under a prefix.
// The store interface itself has no way to list keys, so prefix_store needs this to make
// num_keys() count only its own namespace. memory_store and tcp_store provide it; a
// backend without it makes prefix_store::num_keys fail with errc::unsupported.
#pragma once

#include <cstdint>
#include <string_view>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe {

class prefix_countable {
 public:
  virtual ~prefix_countable() = default;

  /// The number of keys that start with `prefix` (all keys for an empty prefix). The
  /// cost is the backend's: an ordered map walks only the matching keys.
  virtual expected<std::int64_t> num_keys_with_prefix(std::string_view prefix,
                                                      duration timeout) = 0;
};

}  // namespace troupe
