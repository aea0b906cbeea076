// store: the small key-value interface through which workers find each other, exchange
// device maps and NCCL ids, and agree on membership. Implementations: in-process
// (memory_store), TCP (tcp_store, the embedded default), etcd (etcd_store), and the
// prefix_store decorator.
//
// Contract for every implementation:
// - Keys are non-empty strings; values are bytes (empty values are allowed).
// - Every call is bounded: it takes a timeout, or uses the store's default timeout, and
//   fails with errc::timeout naming the key(s) and the time waited when it passes.
// - A broken connection fails the call promptly with errc::connection_lost; nothing hangs.
// - All methods are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe {

/// The key-value interface every store implements; the contract is at the top of this
/// file (keys, timeouts, broken connections, threads). Open one with connect_store().
class store {
 public:
  virtual ~store() = default;

  /// Sets `key` to `value`, replacing any old value, and wakes everyone waiting on `key`.
  virtual expected<void> set(std::string_view key, std::span<const std::byte> value,
                             duration timeout) = 0;

  /// The value of `key`, waiting until it exists or `timeout` passes.
  virtual expected<bytes> get(std::string_view key, duration timeout) = 0;

  /// Whether every key in `keys` exists right now (does not wait for them).
  virtual expected<bool> check(std::span<const std::string> keys, duration timeout) = 0;

  /// Atomically adds `delta` to the decimal integer stored at `key` (a missing key counts
  /// as 0) and returns the new value. A value that is not an integer is invalid_argument.
  virtual expected<std::int64_t> add(std::string_view key, std::int64_t delta,
                                     duration timeout) = 0;

  /// Atomically: if the current value equals `expected_value` (nullopt: the key must be
  /// absent), sets `desired`. Returns the value stored afterwards, so the caller won iff
  /// the result equals `desired`. An absent key with an `expected_value` stays absent and
  /// the result is an empty value.
  virtual expected<bytes> compare_set(std::string_view key,
                                      const std::optional<bytes>& expected_value,
                                      std::span<const std::byte> desired, duration timeout) = 0;

  /// Removes `key`; returns whether it existed.
  virtual expected<bool> erase(std::string_view key, duration timeout) = 0;

  /// Waits until every key in `keys` exists, or fails with errc::timeout naming the
  /// keys still missing.
  virtual expected<void> wait(std::span<const std::string> keys, duration timeout) = 0;

  /// The number of keys this store (or this prefix) holds.
  virtual expected<std::int64_t> num_keys(duration timeout) = 0;

  /// A short description for logs and errors, e.g. "tcp_store 127.0.0.1:29500".
  virtual std::string describe() const = 0;

  // Convenience forms using the store's default timeout.
  /// The default timeout of the forms below (at first, TROUPE_DEFAULT_TIMEOUT's).
  duration timeout() const noexcept { return timeout_; }
  /// Replaces the default timeout of the forms below.
  void set_timeout(duration d) noexcept { timeout_ = d; }
  ///@{
  /// set() with the default timeout; the value given as bytes or as text.
  expected<void> set(std::string_view key, std::span<const std::byte> value) {
    return set(key, value, timeout_);
  }
  expected<void> set(std::string_view key, std::string_view value) {
    return set(key, std::as_bytes(std::span(value.data(), value.size())), timeout_);
  }
  ///@}
  /// get() with the default timeout.
  expected<bytes> get(std::string_view key) { return get(key, timeout_); }
  /// get() with the value read as text.
  expected<std::string> get_string(std::string_view key, duration timeout);
  /// get_string() with the default timeout.
  expected<std::string> get_string(std::string_view key) { return get_string(key, timeout_); }
  /// add() with the default timeout.
  expected<std::int64_t> add(std::string_view key, std::int64_t delta) {
    return add(key, delta, timeout_);
  }
  /// wait() with the default timeout.
  expected<void> wait(std::span<const std::string> keys) { return wait(keys, timeout_); }

 protected:
  store() : timeout_(default_timeout()) {}

 private:
  duration timeout_;
};

}  // namespace troupe
