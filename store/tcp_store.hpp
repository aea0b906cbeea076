// tcp_store: a client of tcp_store_server. Thread-safe: any number of threads may call it
// at once; requests are pipelined on one connection, each under its own request id.
//
// Waiting calls (get, wait) are answered by the server when the keys appear; the client
// never asks again. Callers do their own I/O (no thread handoff; docs/store-protocol.md).
// A broken connection is a sticky error: every pending and later call fails promptly with
// errc::connection_lost.
//
// With a TLS identity (options.tls) a TCP connection speaks mutual TLS and the hello runs
// inside it; the server's local socket stays plain (docs/security.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <troupe/core/tls.hpp>
#include <troupe/store/prefix_count.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

struct tcp_store_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  /// Must equal the server's secret when it has one.
  std::string secret;
  /// The job's TLS identity: when set, a TCP connection speaks mutual TLS (the server must
  /// have an identity the same CA signed); empty (the default): plain TCP. Not
  /// read from the environment here: connect_store() passes tls_config_from_env().
  tls::config tls;
  /// How long connect() keeps retrying (refused connections, a server still starting).
  duration connect_timeout = default_timeout();
  /// The default timeout of calls that take none.
  duration timeout = default_timeout();
  /// The largest frame sent or accepted, in bytes; match the server's.
  std::size_t max_frame_size = std::size_t{64} << 20;
  /// For a loopback host, connect through the server's local socket when it has one
  /// (tcp_store_server_options::local_socket), else TCP. The same protocol either way.
  bool local_socket = true;
};

class tcp_store final : public store, public prefix_countable {
 public:
  /// Connects and completes the hello, retrying until connect_timeout. Fails with
  /// errc::timeout naming the address and the last error, errc::unauthorized when the
  /// server refuses the secret, or TLS is on one side only, or a certificate is refused
  /// (at once, no retry), errc::protocol_error on a version mismatch, and
  /// errc::invalid_argument for unusable TLS files.
  static expected<std::unique_ptr<tcp_store>> connect(tcp_store_options options);

  ~tcp_store() override;
  tcp_store(const tcp_store&) = delete;
  tcp_store& operator=(const tcp_store&) = delete;

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

  /// A set that does not wait for the server: it returns once the request is handed to
  /// the kernel (within `timeout`), and the server applies it without replying, as c10d's
  /// TCPStore does with every set. Later calls on this client see it (one connection keeps
  /// order); other clients see it once the server has read it, so a caller that must know
  /// it is visible everywhere uses set(). A failure after the write (the server gone) is
  /// not reported here but fails every later call (connection_lost). The key and size are
  /// checked here as for set().
  expected<void> set_nowait(std::string_view key, std::span<const std::byte> value,
                            duration timeout);
  expected<void> set_nowait(std::string_view key, std::string_view value) {
    return set_nowait(key, std::as_bytes(std::span(value.data(), value.size())), timeout());
  }

  /// Whether this client reached the server through its local socket rather than TCP.
  bool connected_locally() const noexcept;
  /// Whether the connection speaks TLS (a TCP connection with options.tls set).
  bool uses_tls() const noexcept;

  /// The sticky error, once the connection has broken.
  std::optional<error> connection_error() const;

 private:
  struct impl;
  explicit tcp_store(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
