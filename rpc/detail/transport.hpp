// transport: an agent's sockets (docs/rpc.md, "Threading model").
//
// It owns the I/O context and its threads, the listeners (TCP, plus a local socket beside
// a loopback listener), dialing (a peer on this host through its local socket, else TCP;
// TLS over TCP when the job has an identity) and the table of live connections: those
// this worker opened, one per peer name, and those it accepted.
//
// - The table is under one mutex, held only to read or change it: never while dialing,
//   sending or closing. Dials run one at a time (a second caller for the same peer finds
//   the first one's connection).
// - What frames mean, the handshake's content included, belongs to the agent core
//   (dispatch.cpp): accepted connections go to the connection_owner given to start(), and
//   dial() hands the connected socket to the caller's handshake function.
// - Lifecycle: listen(), then start(); stop_accepting() (from any thread), then stop(),
//   which joins the I/O threads (not the calling one when it is one of them) and clears
//   the table. The destructor stops.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/tls.hpp>
#include <troupe/rpc/detail/connection.hpp>

namespace troupe::rpc::detail {

class transport {
 public:
  struct options {
    /// This worker's name, for messages.
    std::string worker;
    /// Where to listen; empty: this process's address for its job (core/net_address.hpp).
    std::string listen_host;
    std::uint16_t listen_port = 0;
    /// A local socket beside a loopback listener, and dialing peers on this host through
    /// theirs (rpc_backend_options::local_socket).
    bool local_socket = true;
    std::size_t io_threads = 1;
    std::size_t max_queued_bytes = default_max_queued_bytes;
    /// The job's TLS identity for TCP connections; null: plain.
    std::shared_ptr<const tls::context> tls;
  };

  /// Where a peer listens, as its record says.
  struct address {
    std::string worker;
    std::string host;
    std::uint16_t port = 0;
  };

  /// Runs the handshake over a connected socket (with its TLS session, null when plain)
  /// and returns the connection, or the reason it failed (the socket then closed).
  using handshake_fn = std::function<expected<std::shared_ptr<connection>>(
      connection::socket_type, std::unique_ptr<tls::session>, deadline)>;

  explicit transport(options o);
  ~transport();
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// Binds the TCP listener (and the local socket beside a loopback one). Fails with
  /// unavailable naming the address and the settings to change, or with local_address's
  /// error when no address was given and none can be chosen.
  expected<void> listen();
  /// Starts accepting, handing each accepted connection (TLS over TCP when configured)
  /// to `owner` with `handshake_timeout`, and starts the I/O threads. Once, after listen().
  void start(std::weak_ptr<connection_owner> owner, duration handshake_timeout);

  /// The address and port peers reach this worker at (after listen()).
  const std::string& host() const noexcept { return host_; }
  std::uint16_t port() const noexcept { return port_; }
  /// The I/O context, for the owner's timers. Its threads run only between start() and stop().
  asio::io_context& io() noexcept { return io_; }

  /// Connects to `to` and runs `hs` over the socket. Fails with invalid_argument (an
  /// address that is not an IP address), timeout (no connection by `d`) or
  /// connection_lost (refused: the worker may have died), each naming the worker.
  expected<std::shared_ptr<connection>> dial(const address& to, deadline d, const handshake_fn& hs);
  /// The connection this worker opened to `to.worker`, dialed (through `hs`) and kept when
  /// there is none. A connection there is returned even when it failed: its sticky error
  /// then says why. shut_down once stop_accepting() ran.
  expected<std::shared_ptr<connection>> connect(const address& to, deadline d,
                                                const handshake_fn& hs);

  /// The connection opened to `worker`, or null.
  std::shared_ptr<connection> opened(const std::string& worker) const;
  /// Keeps `c` as the connection opened to `worker` (replacing any other).
  void keep_opened(const std::string& worker, std::shared_ptr<connection> c);
  /// Removes and returns the connection opened to `worker`, or null.
  std::shared_ptr<connection> take_opened(const std::string& worker);
  /// Forgets a closed connection: an accepted one always; one opened to its peer when
  /// `opened_too` and the table still holds that same connection.
  void forget(const std::shared_ptr<connection>& c, bool opened_too);
  /// The connections opened by this worker / every live connection, a snapshot.
  std::vector<std::shared_ptr<connection>> opened_all() const;
  std::vector<std::shared_ptr<connection>> all() const;

  /// Closes the listeners (on the I/O threads) and refuses later connects. Any thread.
  void stop_accepting();
  /// Stops the I/O threads and joins them (not the calling thread, when it is one of
  /// them), then clears the table. Idempotent.
  void stop();

 private:
  // A local socket beside a loopback listener; any failure only loses the fast path.
  void listen_locally();
  // Connects through `to`'s local socket; null when it has none or this worker uses none.
  std::optional<connection::socket_type> dial_locally(const address& to,
                                                      const asio::ip::address& addr);
  // A TLS session for a new TCP connection (null when plain).
  expected<std::unique_ptr<tls::session>> new_tls_session(bool client) const;
  // Takes an accepted socket into the table and starts it.
  void adopt(connection::socket_type sock, bool tcp);
  template <class Acceptor>
  void accept_on(Acceptor& from, const char* what, bool tcp,
                 std::shared_ptr<std::function<void()>>& keep);

  options opts_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::optional<asio::ip::tcp::acceptor> acceptor_;
  std::optional<asio::local::stream_protocol::acceptor> local_acceptor_;
  std::shared_ptr<std::function<void()>> accept_loop_;
  std::shared_ptr<std::function<void()>> local_accept_loop_;
  std::vector<std::thread> threads_;
  std::string host_;
  std::uint16_t port_ = 0;
  std::weak_ptr<connection_owner> owner_;
  duration handshake_timeout_{};
  std::atomic<bool> closing_{false};
  std::atomic<bool> running_{false};

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<connection>> opened_;
  std::set<std::shared_ptr<connection>> accepted_;
  std::mutex dial_mu_;
};

}  // namespace troupe::rpc::detail
