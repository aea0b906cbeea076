// server_connection: one client connection of tcp_store_server. It lives on one event
// loop (an io_context run by exactly one thread): its input side needs no strand or lock.
// Its output side (outbox, socket writes) is behind out_mu_, so that another loop's
// thread can write a notification straight onto the socket (send_from_elsewhere).
//
// The replies to the frames of one read leave with one gathered non-blocking send, at
// once; the connection waits for writability only when the socket is full. Reads go
// through Asio's async_read_some (a recv first, then the edge-triggered epoll wait).
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <atomic>
#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/tls.hpp>
#include <troupe/store/detail/server_core.hpp>
#include <troupe/store/detail/wire.hpp>

namespace troupe::detail {

class server_connection : public std::enable_shared_from_this<server_connection> {
 public:
  using tcp = boost::asio::ip::tcp;
  /// A TCP connection or a local (Unix domain) one: the protocol is the same.
  using stream_socket = boost::asio::generic::stream_protocol::socket;

  /// `socket` must belong to `loop`, and `loop` must be run by exactly one thread. `peer`
  /// names the other end in log lines. `tls`: the connection's TLS session (server side),
  /// null for a plain connection.
  server_connection(boost::asio::io_context& loop, stream_socket socket, std::string peer,
                    std::shared_ptr<server_core> core, std::unique_ptr<tls::session> tls = nullptr);

  /// Any thread: starts the hello timer and reading, on the connection's loop.
  void start();
  /// On the loop: queues a reply and, unless replies are being batched, sends it.
  void send(bytes frame);
  /// Any other thread: sends a reply right away when nothing of this connection's is
  /// being written, else queues it for the connection's loop.
  void send_from_elsewhere(bytes frame);
  /// On the loop: closes the socket and forgets the connection. Warn-level reasons are
  /// the peer's fault.
  void close(const std::string& reason, bool warn);

  boost::asio::io_context& loop() noexcept { return loop_; }
  const std::string& peer() const noexcept { return peer_; }
  /// Any thread, before start(): closes the socket of a connection never started.
  void drop() noexcept {
    boost::system::error_code ec;
    socket_.close(ec);
  }

 private:
  std::size_t prepare_read();
  boost::asio::mutable_buffer read_buffer();
  void read_now();
  void wait_readable();
  void on_read(boost::system::error_code ec, std::size_t got, std::size_t room);
  bool process();
  void resume_reading();
  bool over_limit() const {
    return queued_.load(std::memory_order_relaxed) > core_->options.max_queued_output;
  }
  void account(std::ptrdiff_t delta);
  // Whether queuing `more` bytes would pass max_unread_output; out_mu_ held. The first
  // time, marks the connection overflowed and posts its close to the loop.
  bool overflows_locked(std::size_t more);
  std::size_t frame_length() const;
  bool parse_frames();
  void on_frame(std::span<const std::byte> body);
  void on_hello(std::span<const std::byte> body);
  void on_auth(std::span<const std::byte> body);
  void admit();
  void refuse(const error& e);
  void handle(wire::request q);
  void deliver(std::vector<wake_reply>& ready);
  void flush();
  void wait_writable();
  // A plain client that sends a TLS ClientHello: refused with a reply it can read.
  bool refuse_tls_client(std::span<const std::byte> first);
  // TLS (server_connection_tls.cpp).
  bool tls_input(std::size_t n);
  bool tls_drain();
  void refuse_plain_client(std::span<const std::byte> first);
  void tls_refuse(const error& e);
  // out_mu_ held: encrypts `frame`; false (and a post of the close) when that fails.
  bool seal_locked(bytes& frame);
  // out_mu_ held: appends what the session has to send to the outbox.
  void take_tls_output_locked();

  static constexpr std::size_t read_chunk = std::size_t{64} << 10;
  // Ciphertext read per call before the hello: one TLS record and its header fit.
  static constexpr std::size_t tls_hello_chunk = (std::size_t{16} << 10) + 512;

  boost::asio::io_context& loop_;
  stream_socket socket_;
  boost::asio::steady_timer timer_;
  std::shared_ptr<server_core> core_;
  std::string peer_;
  bytes in_;  // received bytes; [in_begin_, in_end_) not yet parsed
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  // The output side, shared with other loops' threads that send notifications: guarded
  // by out_mu_ (writing_ and queued_ are written under it; the loop reads them freely).
  std::mutex out_mu_;
  int fd_ = -1;  // the socket, while open_
  bool open_ = false;
  std::vector<bytes> outbox_;   // replies not yet (fully) sent, from out_head_ on
  std::size_t out_head_ = 0;    // first frame of outbox_ not fully sent
  std::size_t out_offset_ = 0;  // bytes of outbox_[out_head_] already sent
  std::vector<boost::asio::const_buffer> out_buffers_;
  std::atomic<std::size_t> queued_{0};  // unsent bytes in outbox_
  bool writing_ = false;                // waiting for the socket to take more
  bool read_paused_ = false;            // too many unsent replies: not reading until they drain
  bool parsing_ = false;                // replies queue until the frames of one read are handled
  bool authenticated_ = false;
  // Between the challenge and the client's answer: both nonces of this connection.
  bool challenged_ = false;
  std::string client_nonce_;
  std::string server_nonce_;
  bool closing_ = false;     // refuse the peer once the outbox is flushed
  bool overflowed_ = false;  // passed max_unread_output: nothing more is queued; closing
  bool closed_ = false;
  bool first_read_ = true;             // nothing received yet: the first bytes say TLS or plain
  std::unique_ptr<tls::session> tls_;  // guarded by out_mu_; null: plain
  bytes cipher_in_;                    // TLS: ciphertext read, on the loop only
};

}  // namespace troupe::detail
