// connection: one TCP connection between two agents, after or during its handshake.
//
// Threading: the socket lives on its own strand; reads, closes and timers run there and
// frames are handed to the owner on that strand (an I/O thread). send() may be called
// from any thread: under a write mutex it writes straight to the socket with a gathered
// non-blocking sendmsg, and only when the kernel buffer is full does the rest go to the
// strand, which finishes it when the socket is writable. Closing happens under the same
// mutex, so no thread writes to a closed descriptor.
//
// Errors are sticky: the first failure (read error, EOF, protocol error, close()) is
// recorded, every pending call on the connection fails with it at once, and every later
// send() returns it.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <boost/asio.hpp>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "core/future.hpp"
#include "core/worker_info.hpp"
#include "rpc/wire.hpp"

namespace troupe::rpc::detail {

namespace asio = boost::asio;

class connection;

/// Receives a connection's frames and its end; both called on the connection's strand.
class connection_owner {
 public:
  virtual ~connection_owner() = default;
  virtual void on_frame(const std::shared_ptr<connection>& c, wire::frame&& f) = 0;
  /// Called once, after pending calls were failed with `why`.
  virtual void on_closed(const std::shared_ptr<connection>& c, const error& why) = 0;
};

class connection : public std::enable_shared_from_this<connection> {
 public:
  using socket_type = asio::ip::tcp::socket;

  /// `outbound`: we connected (we send requests, the peer answers).
  connection(socket_type sock, std::weak_ptr<connection_owner> owner, bool outbound,
             wire::limits lim);
  ~connection();

  /// Starts reading. An inbound connection that has no peer identity after
  /// `handshake_timeout` is closed.
  void start(duration handshake_timeout);

  /// Writes a finished frame (see the class comment). Fails with the sticky error.
  expected<void> send(wire::frame_builder&& f);

  /// Closes with `why` as the sticky error (the first reason wins). Any thread.
  void close(error why);

  /// The peer sent an orderly shutdown notice: later failures read as peer_left.
  void mark_peer_leaving();

  std::optional<error> sticky_error() const;
  bool outbound() const noexcept { return outbound_; }
  worker_info peer() const;
  void set_peer(worker_info w);
  void set_limits(wire::limits lim);
  const std::string& remote_address() const noexcept { return remote_; }

  /// Registers an outstanding call; fails with the sticky error when closed.
  expected<void> add_pending(std::uint64_t id, promise<wire::frame>&& p, deadline d);
  /// Completes and forgets call `id`; false when unknown (late reply after a timeout).
  bool complete(std::uint64_t id, expected<wire::frame>&& r);
  /// Fails every call whose deadline passed by `now` with errc::timeout.
  void expire(clock::time_point now);
  std::size_t pending_count() const;

 private:
  struct out_frame {
    wire::frame_builder fb;
    std::size_t offset = 0;
  };
  void read_more();
  void on_read(const boost::system::error_code& ec, std::size_t n, bool into_window);
  void on_writable(const boost::system::error_code& ec);
  // Writes queued frames until done or EAGAIN; wmu_ held. Returns an error on failure.
  std::optional<error> flush_locked();
  void fail_all(const error& e);
  void do_close(error why);
  error describe_loss(std::string_view what) const;

  socket_type socket_;
  asio::steady_timer handshake_timer_;
  std::weak_ptr<connection_owner> owner_;
  const bool outbound_;
  std::string remote_;
  wire::frame_decoder decoder_;
  std::vector<std::byte> read_buf_;
  std::vector<wire::frame> ready_;

  mutable std::mutex wmu_;  // the write side, the sticky error and the closed flag
  std::deque<out_frame> queue_;
  bool waiting_writable_ = false;
  bool closed_ = false;
  bool notified_ = false;
  std::optional<error> error_;
  std::atomic<bool> peer_leaving_{false};

  mutable std::mutex pmu_;  // pending calls and the peer identity
  struct pending {
    promise<wire::frame> p;
    clock::time_point at;
  };
  std::map<std::uint64_t, pending> pending_;
  std::optional<error> pending_error_;
  worker_info peer_;
};

}  // namespace troupe::rpc::detail
