// tcp_store_server: the embedded TCP store server. Any process can host one; it runs its
// own I/O threads (io_threads) and serves many tcp_store clients (docs/store-protocol.md).
//
// - Binds where told: 127.0.0.1 unless `host` says otherwise. Binding every interface
//   takes an explicit "0.0.0.0" or "::".
// - Port 0 picks a free port; port() reports the one bound.
// - A frame that is malformed, truncated or larger than max_frame_size closes only the
//   connection that sent it (logged at warn); everyone else is served on.
// - With a secret, clients whose hello does not carry the same secret are refused.
// - Before its hello a connection may send one frame of at most 8 KiB (wire::max_hello_size)
//   and the server holds no more than that for it; a larger frame is read as its bytes
//   arrive, never allocated at the length it claims. A peer that does not finish its hello
//   within hello_timeout is dropped; connections past max_connections are closed at once.
// - When accept() fails (out of descriptors), the server pauses accepting (10 ms doubling
//   to 1 s), logs at most once a second, serves the connections it has and resumes alone.
// - A connection whose unsent replies pass max_queued_output is not read from until they
//   drain (backpressure on a client that does not read). Notifications of other clients'
//   writes cannot be held back that way; a connection whose unsent bytes pass
//   max_unread_output is dropped (logged at warn) and everything queued for it is freed.
// - With a TLS identity (options.tls), TCP connections speak mutual TLS and the hello runs
//   inside it; a client without TLS is refused with a plain error reply (logged at warn),
//   and a server without TLS refuses a TLS client the same way. The local socket stays
//   plain. A connection that does not finish the TLS handshake and its hello within
//   hello_timeout is dropped like any other (docs/security.md, "TLS between hosts").
// - shutdown() is idempotent and bounded; the destructor calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/core/tls.hpp>

namespace troupe {

struct tcp_store_server_options {
  /// Interface to bind: an address or a host name. Never empty.
  std::string host = "127.0.0.1";
  /// 0 picks a free port.
  std::uint16_t port = 0;
  /// When non-empty, clients must present this secret in their hello.
  std::string secret;
  /// The job's TLS identity. When set, TCP clients must speak mutual TLS with a certificate
  /// the same CA signed (the hello and the secret's proof then run inside it); empty (the
  /// default): plain TCP. Not read from the environment here: callers that follow the
  /// settings pass tls_config_from_env() (store/connect.hpp), as troupe-run does.
  tls::config tls;
  /// The largest frame accepted, in bytes (length prefix excluded). 64 MiB by default.
  std::size_t max_frame_size = std::size_t{64} << 20;
  /// A connection that has not completed its hello in this time is closed.
  duration hello_timeout = std::chrono::seconds(10);
  /// When the replies waiting to go to one connection pass this many bytes, the server
  /// stops reading that connection's requests until they drain: a client that sends but
  /// never reads cannot make the server buffer without bound. 16 MiB by default.
  std::size_t max_queued_output = std::size_t{16} << 20;
  /// The hard limit: when the bytes waiting to go to one connection (its replies plus the
  /// values woken by other clients' writes, which backpressure cannot hold back) would
  /// pass this, the connection is closed and its queue freed. A frame into an empty queue
  /// is always taken. 0 (the default) means max_queued_output + 2 * max_frame_size
  /// (144 MiB with the defaults); otherwise it must be at least max_queued_output.
  std::size_t max_unread_output = 0;
  /// Connections open at once; one more is closed as soon as it is accepted (logged at
  /// most once a second). Each costs a descriptor and at most a few KiB until its hello.
  std::size_t max_connections = 4096;
  /// Event loops (one thread each) that the connections are spread over; 0 picks one per
  /// hardware thread, at most 4. At most 64.
  std::size_t io_threads = 0;
  /// When bound to a loopback address, also listen on a local (Unix domain) socket in
  /// the abstract namespace, named after the TCP address (see local_socket_name()).
  /// Clients on this host connect there unless told otherwise: same protocol, same secret,
  /// a cheaper kernel path than loopback TCP. Nothing is created in the file system.
  bool local_socket = true;
  /// How long the destructor waits for connections to close.
  duration shutdown_timeout = std::chrono::seconds(5);
};

/// The abstract-namespace name (leading NUL byte included) of the local socket of a
/// server bound to `address` (as printed by the server, e.g. "127.0.0.1") and `port`.
std::string local_socket_name(std::string_view address, std::uint16_t port);

class tcp_store_server {
 public:
  /// Binds, listens and starts the I/O threads. Fails with invalid_argument for a bad host
  /// or unusable TLS files (naming the setting and the file), and unavailable when the
  /// address cannot be bound (the message says why).
  static expected<std::unique_ptr<tcp_store_server>> start(tcp_store_server_options options);

  ~tcp_store_server();
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  /// The bound address and port.
  const std::string& host() const noexcept;
  std::uint16_t port() const noexcept;
  /// "tcp://host:port", ready for connect_store().
  std::string url() const;
  /// Whether the server also listens on its local socket (a loopback bind with
  /// local_socket set, and the name was free).
  bool has_local_socket() const noexcept;
  /// Whether TCP connections speak TLS (options.tls was set).
  bool uses_tls() const noexcept;

  /// Closes the listener and every connection (their clients see connection_lost), then
  /// stops the I/O threads. Waits at most `timeout` for an orderly close, then forces it.
  /// Later calls return at once.
  void shutdown(duration timeout);

  /// Connections currently open (for tests and diagnostics).
  std::size_t num_connections() const;
  /// Bytes of replies queued for sending, over all connections (for tests and diagnostics).
  std::size_t queued_output_bytes() const;

 private:
  struct impl;
  explicit tcp_store_server(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
