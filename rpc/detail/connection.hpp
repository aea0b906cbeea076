// connection: one TCP connection between two agents, after or during its handshake.
//
// Threading: the socket lives on its own strand; reads, closes and timers run there and
// frames are handed to the owner on that strand (an I/O thread). send() may be called
// from any thread and appends the frame to the connection's queue under a write mutex;
// one thread at a time (the *writer*) writes from the front of the queue with gathered
// non-blocking sendmsg calls, outside the mutex, so senders keep appending meanwhile.
// Frames leave in the order they were queued, whoever writes them.
//
// - write_mode::now (requests, responses): a sender that finds no writer becomes the
//   writer and writes everything queued up to and including its frame on its own thread.
// - write_mode::combine (one-way calls): the frame is queued and the strand is asked to
//   write; every frame queued until it runs goes out in the same gathered write.
// - When the kernel buffer is full the writer stops and the strand finishes the queue
//   when the socket is writable.
// - Backpressure: while `max_queued_bytes` or more wait, send() blocks the caller until
//   there is room or its deadline passes (errc::timeout naming the peer), except on an
//   I/O thread, which never waits (it may be the one that has to drain the queue).
// - close() first writes what is queued (up to drain_timeout) and only then closes; a
//   connection that breaks drops its queue with a warning naming how many frames were
//   lost. The descriptor is closed only when no writer is active.
//
// TLS (docs/security.md, "TLS between hosts"): a connection given a tls::session runs its
// bytes through it over memory buffers, so the model above stays. The strand feeds what it
// reads into the session (driving the TLS handshake first, before any frame) and hands the
// plaintext to the frame decoder, straight into a tensor's memory when the decoder waits
// for a payload. The writer encrypts queued frames, a chunk at a time, into `cipher_out_`
// and sends that with the same non-blocking sends; a frame counts as written (its
// `written` promise completes) once it is encrypted, and queued_bytes() counts plaintext
// not yet encrypted plus ciphertext not yet sent. `tls_mu_` serializes every call on the
// session (the strand's reads and the writer's encryption); it is held only around them,
// never across a wait, and may be taken under `wmu_`, never the reverse. Frames wait in the
// queue until the TLS handshake completes.
//
// Errors are sticky: the first failure (read error, EOF, protocol error, close()) is
// recorded, every pending call on the connection fails with it at once, and every later
// send() returns it.
#pragma once

#include <utility>  // before Asio, for g++ 12

#include <atomic>
#include <boost/asio.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include <troupe/core/future.hpp>
#include <troupe/core/tls.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/wire.hpp>

namespace troupe::rpc::detail {

namespace asio = boost::asio;

class connection;

/// How send() writes a frame (see the class comment).
enum class write_mode {
  now,      ///< written at once on the calling thread, with everything queued before it
  combine,  ///< queued; the strand writes the queue soon, in one gathered write
};

/// Bytes a connection lets wait in its send queue before senders block.
inline constexpr std::size_t default_max_queued_bytes = 64u << 20;
/// How long close() keeps writing what is queued before it closes anyway.
inline constexpr duration drain_timeout = std::chrono::seconds(2);

/// True on an I/O thread of an agent (set by mark_io_thread()).
bool is_io_thread() noexcept;
void mark_io_thread();

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
  /// TCP, or a local (Unix domain) socket to a peer on this host.
  using socket_type = asio::generic::stream_protocol::socket;

  /// `outbound`: we connected (we send requests, the peer answers). `tls`: the connection's
  /// TLS session (client side when outbound), or null for plain bytes.
  connection(socket_type sock, std::weak_ptr<connection_owner> owner, bool outbound,
             wire::limits lim, std::size_t max_queued_bytes = default_max_queued_bytes,
             std::unique_ptr<tls::session> tls = nullptr);
  ~connection();

  /// Starts reading. An inbound connection that has no peer identity after
  /// `handshake_timeout` is closed.
  void start(duration handshake_timeout);

  /// Queues a finished frame and writes it as `mode` says (see the class comment). Fails
  /// with the sticky error, or with errc::timeout when the queue stayed full until `until`.
  /// `written`, when given, completes once the frame is handed to the kernel (or fails
  /// with the reason it never will be); it is how a one-way call carrying tensor views
  /// that own nothing learns when their memory may be reused.
  expected<void> send(wire::frame_builder&& f, write_mode mode = write_mode::now,
                      deadline until = deadline::after(std::chrono::seconds(30)),
                      std::optional<promise<void>> written = std::nullopt);

  /// Writes what is queued (bounded by drain_timeout), then closes with `why` as the
  /// sticky error (the first reason wins). Any thread.
  void close(error why);

  /// Bytes queued and not yet handed to the kernel.
  std::size_t queued_bytes() const;

  /// The peer is shutting down: later failures read as peer_left.
  void mark_peer_leaving();
  /// The peer's shutdown notice arrived on this connection (so did all it sent before).
  void note_shutdown_notice();
  bool shutdown_notice_seen() const noexcept { return notice_seen_.load(); }

  std::optional<error> sticky_error() const;
  bool outbound() const noexcept { return outbound_; }
  worker_info peer() const;
  void set_peer(worker_info w);
  void set_limits(wire::limits lim);
  const std::string& remote_address() const noexcept { return remote_; }
  /// Whether the connection runs over TLS.
  bool secure() const noexcept { return tls_ != nullptr; }
  /// Whether its TLS handshake completed (always false for a plain connection).
  bool tls_established() const noexcept { return tls_ready_.load(); }

  /// An accepted connection between the challenge and the caller's proof: who the caller
  /// claims to be and both nonces. Touched only by the frame handler, on the strand.
  struct pending_handshake {
    worker_info who;
    std::string group;
    std::string caller_nonce;
    std::string acceptor_nonce;
  };
  std::optional<pending_handshake>& challenge_state() noexcept { return challenge_; }

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
    std::optional<promise<void>> written;
  };
  // Promises of frames written (or dropped) under wmu_, completed once it is released.
  using written_list = std::vector<promise<void>>;
  void read_more();
  void on_read(const boost::system::error_code& ec, std::size_t n, bool into_window);
  void on_writable(const boost::system::error_code& ec);
  void flush_on_strand();
  // Asks the strand to write the queue (once until it runs); wmu_ held.
  void schedule_flush_locked();
  enum class write_result { done, would_block, failed };
  // The writer's loop: writes from the front until `until_popped` frames have left in
  // total (or the queue is empty), dropping wmu_ around each sendmsg. On would_block the
  // caller arms the writable wait or polls; on failed, `failure` says why.
  write_result write_queue(std::unique_lock<std::mutex>& lk, std::uint64_t until_popped,
                           std::optional<error>& failure, written_list& done);
  // Ends a writer's turn: arms the writable wait, hands leftovers to the strand, or closes.
  void end_write(std::unique_lock<std::mutex>& lk, write_result r, std::optional<error> failure);
  // One writer's whole turn, wmu_ held and no writer active: writes up to `until_popped`,
  // ends the turn, releases wmu_ and completes the promises of what was written. Returns
  // the failure, if any.
  std::optional<error> write_turn(std::unique_lock<std::mutex>& lk, std::uint64_t until_popped);
  // Writes the queue with blocking waits until it is empty or `until` (close()).
  void drain(std::unique_lock<std::mutex>& lk, deadline until, written_list& done);
  error queue_full_error() const;
  void fail_all(const error& e);
  void do_close(error why, bool drain_first = false);
  error describe_loss(std::string_view what) const;
  // Whether a writer turn has anything to do; wmu_ held and no other writer active.
  bool has_work_locked() const;
  // Asks the strand for a writer turn when one has work and none is active or waiting.
  void kick_writer();
  // TLS: starts the client's handshake (strand).
  void tls_start();
  // TLS: what the strand does with `n` bytes read into read_buf_; closes on failure and
  // returns false.
  bool tls_input(std::size_t n);
  // TLS: the writer's loop (see write_queue).
  write_result write_queue_tls(std::unique_lock<std::mutex>& lk, std::uint64_t until_popped,
                               std::optional<error>& failure, written_list& done);
  // The peer does not use TLS where this connection does, or the reverse (or, when
  // `closed_in_handshake`, it closed during the TLS handshake): the error that says so.
  error tls_mismatch(bool closed_in_handshake) const;

  socket_type socket_;
  asio::steady_timer handshake_timer_;
  std::optional<pending_handshake> challenge_;
  std::weak_ptr<connection_owner> owner_;
  const bool outbound_;
  std::string remote_;
  wire::frame_decoder decoder_;
  std::vector<std::byte> read_buf_;
  std::vector<wire::frame> ready_;
  bool nothing_read_ = true;  // strand: no byte has arrived yet

  // TLS (null for a plain connection); see the class comment.
  std::unique_ptr<tls::session> tls_;
  mutable std::mutex tls_mu_;           // every call on tls_
  std::atomic<bool> tls_ready_{false};  // its handshake completed
  std::vector<std::byte> plain_in_;     // strand: decrypted bytes for the decoder
  std::vector<std::byte> cipher_out_;   // the active writer's ciphertext to send
  std::size_t cipher_sent_ = 0;         // of cipher_out_
  std::vector<std::byte> stage_;        // the writer's small pieces, encrypted as one record

  mutable std::mutex wmu_;       // the write side, the sticky error and the closed flag
  std::condition_variable wcv_;  // a writer finished, or the queue has room again
  std::deque<out_frame> queue_;
  std::size_t queued_bytes_ = 0;
  const std::size_t max_queued_;
  std::uint64_t pushed_ = 0;   // frames queued so far
  std::uint64_t popped_ = 0;   // frames fully written so far
  bool writing_ = false;       // a writer is active (it alone pops and writes)
  bool flush_posted_ = false;  // a flush_on_strand is on its way
  bool waiting_writable_ = false;
  bool closed_ = false;
  bool notified_ = false;
  std::optional<error> error_;
  std::atomic<bool> peer_leaving_{false};
  std::atomic<bool> notice_seen_{false};

  mutable std::mutex pmu_;  // pending calls and the peer identity
  struct pending {
    promise<wire::frame> p;
    clock::time_point at;
    clock::time_point started;  // for troupe_rpc_client_latency_seconds
  };
  std::map<std::uint64_t, pending> pending_;
  std::optional<error> pending_error_;
  worker_info peer_;
};

}  // namespace troupe::rpc::detail
