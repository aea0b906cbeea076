#include <troupe/store/detail/server_connection.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include <troupe/core/hmac.hpp>
#include <troupe/core/log.hpp>

namespace troupe::detail {

namespace asio = boost::asio;

server_connection::server_connection(asio::io_context& loop, stream_socket socket, std::string peer,
                                     std::shared_ptr<server_core> core,
                                     std::unique_ptr<tls::session> tls)
    : loop_(loop),
      socket_(std::move(socket)),
      timer_(loop),
      core_(std::move(core)),
      peer_(std::move(peer)),
      tls_(std::move(tls)) {}

void server_connection::start() {
  asio::post(loop_, [self = shared_from_this()] {
    boost::system::error_code ec;
    self->socket_.non_blocking(true, ec);
    if (ec)
      return self->close(strcat("cannot make the socket non-blocking: ", ec.message()), false);
    if (self->socket_.local_endpoint(ec).protocol().family() != AF_UNIX)
      self->socket_.set_option(tcp::no_delay(true), ec);
    {
      std::lock_guard lk(self->out_mu_);
      self->fd_ = self->socket_.native_handle();
      self->open_ = true;
    }
    self->timer_.expires_after(self->core_->options.hello_timeout);
    self->timer_.async_wait([self](boost::system::error_code e) {
      if (!e && !self->authenticated_)
        self->close(strcat("no hello within ", format_duration(self->core_->options.hello_timeout)),
                    true);
    });
    // Read first, wait after: an edge that came before this point is not waited for.
    self->read_now();
  });
}

// Makes room in in_ after the unparsed bytes, as far as the frame at its head needs;
// returns the room.
std::size_t server_connection::prepare_read() {
  std::size_t kept = in_end_ - in_begin_;
  if (in_begin_ != 0) {
    if (kept != 0) std::memmove(in_.data(), in_.data() + in_begin_, kept);
    in_begin_ = 0;
    in_end_ = kept;
  }
  // Before the hello a connection holds at most one small frame; after it, a large frame's
  // buffer grows (doubling) as its bytes actually arrive, never to the length it claims.
  std::size_t chunk = authenticated_ ? read_chunk : wire::length_size + wire::max_hello_size;
  std::size_t want = chunk;
  if (kept >= wire::length_size) {
    std::size_t need = wire::length_size + frame_length();
    want = std::max(chunk, std::min(need, 2 * kept));
  }
  if (in_.size() < want) {
    in_.resize(want);
  } else if (kept == 0 && in_.size() > chunk) {
    bytes fresh(chunk);  // give back the room a large frame needed
    in_.swap(fresh);
  }
  return in_.size() - in_end_;
}

// Where the next read goes: after the unparsed bytes in in_, or (TLS) into cipher_in_,
// which holds one record's worth before the hello.
asio::mutable_buffer server_connection::read_buffer() {
  if (!tls_) {
    std::size_t room = prepare_read();
    return asio::buffer(in_.data() + in_end_, room);
  }
  cipher_in_.resize(authenticated_ ? read_chunk : tls_hello_chunk);
  return asio::buffer(cipher_in_);
}

// Reads what the socket has now (a resumed or continued read, or the first one).
void server_connection::read_now() {
  if (closed_) return;
  if (tls_ && !tls_drain()) return;  // plaintext the session still holds comes first
  auto buffer = read_buffer();
  std::size_t room = buffer.size();
  boost::system::error_code ec;
  std::size_t got = 0;
  do {
    got = socket_.read_some(buffer, ec);
  } while (ec == asio::error::interrupted);
  if (ec == asio::error::would_block || ec == asio::error::try_again) return wait_readable();
  on_read(ec, got, room);
}

// Asio's read: it tries at once (usually EAGAIN, one cheap recv) and otherwise waits for
// the next readiness edge. Measured cheaper per request than async_wait, which re-arms
// the descriptor with epoll_ctl each time.
void server_connection::wait_readable() {
  auto buffer = read_buffer();
  std::size_t room = buffer.size();
  socket_.async_read_some(
      buffer, [self = shared_from_this(), room](boost::system::error_code ec, std::size_t got) {
        if (self->closed_) return;
        self->on_read(ec, got, room);
      });
}

// Answers what a read brought; reads on after a short read, or (a full buffer) after the
// other handlers queued on this loop.
void server_connection::on_read(boost::system::error_code ec, std::size_t got, std::size_t room) {
  if (ec) {
    // A peer that stops within a length prefix ends the stream cleanly; within a body it
    // breaks a frame.
    bool mid_frame = in_end_ - in_begin_ >= wire::length_size;
    if (ec == asio::error::eof)
      return close(mid_frame ? "the peer closed it in the middle of a frame" : "the peer closed it",
                   mid_frame);
    return close(ec.message(), mid_frame);
  }
  if (tls_) {
    if (!tls_input(got)) return;
  } else {
    if (std::exchange(first_read_, false) &&
        refuse_tls_client(std::span<const std::byte>(in_.data() + in_end_, got)))
      return;
    in_end_ += got;
    if (!process()) return;
  }
  if (got < room) return wait_readable();
  asio::post(loop_, [self = shared_from_this()] { self->read_now(); });
}

// Answers the frames buffered in in_; the replies to all of them leave in one write.
// False when reading must not go on: closed, refusing, or too many unsent replies (then
// the rest stays buffered and flush() resumes once they drain).
bool server_connection::process() {
  for (;;) {
    parsing_ = true;
    bool held_back = parse_frames();
    parsing_ = false;
    if (!closed_ && !writing_) flush();
    if (closed_ || closing_) return false;
    if (over_limit()) {
      read_paused_ = true;
      return false;
    }
    if (!held_back) break;  // the socket took the replies at once: answer the rest
  }
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  return true;
}

void server_connection::resume_reading() {
  if (closed_ || !read_paused_ || over_limit()) return;
  read_paused_ = false;
  if (process()) read_now();
}

void server_connection::account(std::ptrdiff_t delta) {
  queued_.store(static_cast<std::size_t>(static_cast<std::ptrdiff_t>(queued_.load()) + delta),
                std::memory_order_relaxed);
  if (delta >= 0)
    core_->queued_output.fetch_add(static_cast<std::size_t>(delta), std::memory_order_relaxed);
  else
    core_->queued_output.fetch_sub(static_cast<std::size_t>(-delta), std::memory_order_relaxed);
}

std::size_t server_connection::frame_length() const {
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < wire::length_size; ++i)
    n |= std::to_integer<std::uint32_t>(in_[in_begin_ + i]) << (8 * i);
  return n;
}

// Every complete frame in the buffer, in order; a partial one waits for the next read.
// True when complete frames were left because too many replies wait to be sent.
bool server_connection::parse_frames() {
  while (!closed_ && !closing_ && in_end_ - in_begin_ >= wire::length_size) {
    if (over_limit()) return true;
    std::size_t n = frame_length();
    if (!authenticated_ && n > wire::max_hello_size) {
      close(strcat("first frame of ", n, " bytes exceeds the ", wire::max_hello_size,
                   "-byte limit on a hello (is this a troupe store client?)"),
            true);
      return false;
    }
    if (n > core_->options.max_frame_size) {
      close(strcat("frame of ", n, " bytes exceeds the limit of ", core_->options.max_frame_size,
                   " bytes (raise max_frame_size on server and clients if intended)"),
            true);
      return false;
    }
    if (n < wire::min_body) {
      close(strcat("frame of ", n, " bytes is shorter than the ", wire::min_body, "-byte minimum"),
            true);
      return false;
    }
    if (in_end_ - in_begin_ < wire::length_size + n) break;
    std::span<const std::byte> body(in_.data() + in_begin_ + wire::length_size, n);
    in_begin_ += wire::length_size + n;
    on_frame(body);
  }
  return false;
}

// One complete frame body; it points into in_, which stays put until the next read.
void server_connection::on_frame(std::span<const std::byte> body) {
  if (!authenticated_) return challenged_ ? on_auth(body) : on_hello(body);
  auto q = wire::decode_request(body);
  if (!q) return close(q.error().message(), true);
  handle(std::move(*q));
}

void server_connection::on_hello(std::span<const std::byte> body) {
  auto h = wire::decode_hello(body);
  if (!h) return close(h.error().message(), true);
  if (h->version != wire::version)
    return refuse(make_error(errc::protocol_error, "this store server speaks protocol version ",
                             wire::version, " and the client speaks ", h->version,
                             "; use the same troupe version on both sides"));
  const std::string& secret = core_->options.secret;
  if (secret.empty()) return admit();
  // The secret is proven, never sent: the server answers with its nonce and its own proof
  // (so that the client knows it reached the job's store), then waits for the client's.
  if (h->nonce.size() < 16)
    return refuse(make_error(errc::protocol_error, "the client's nonce is ", h->nonce.size(),
                             " bytes; at least 16 are required"));
  auto nonce = make_nonce();
  if (!nonce) return refuse(nonce.error());
  client_nonce_ = std::move(h->nonce);
  server_nonce_.assign(reinterpret_cast<const char*>(nonce->data()), nonce->size());
  challenged_ = true;
  send(wire::encode_challenge(
      {server_nonce_, wire::handshake_proof("server", secret, client_nonce_, server_nonce_)}));
}

void server_connection::on_auth(std::span<const std::byte> body) {
  auto a = wire::decode_auth(body);
  if (!a) return close(a.error().message(), true);
  if (!a->has_secret)
    return refuse(make_error(errc::unauthorized, core_->name,
                             " requires a shared secret and the client has none"));
  auto want = wire::handshake_proof("client", core_->options.secret, client_nonce_, server_nonce_);
  if (!equal_constant_time(std::as_bytes(std::span(want.data(), want.size())),
                           std::as_bytes(std::span(a->proof.data(), a->proof.size()))))
    return refuse(make_error(errc::unauthorized, core_->name,
                             " refused the client's proof of the shared secret (a different "
                             "secret)"));
  admit();
}

// A server without TLS that receives a TLS ClientHello (a record of type 22, version 3.x;
// no plain hello starts so: its length would be over 64 KiB) refuses it with a plain error
// reply, which the TLS client recognizes as an answer without TLS.
bool server_connection::refuse_tls_client(std::span<const std::byte> first) {
  if (first.size() < 2 || first[0] != std::byte{0x16} || first[1] != std::byte{0x03}) return false;
  refuse(make_error(errc::unauthorized,
                    "a TLS client, and this store server does not use TLS: set TROUPE_TLS_CERT, "
                    "TROUPE_TLS_KEY and TROUPE_TLS_CA on both sides (the store server and every "
                    "client), or on neither"));
  return true;
}

void server_connection::admit() {
  authenticated_ = true;
  challenged_ = false;
  timer_.cancel();
  send(wire::encode_hello_ok(core_->name));
}

void server_connection::refuse(const error& e) {
  TROUPE_LOG(log_level::warn, "store", core_->name, ": refusing ", peer_, ": ", e.message());
  closing_ = true;
  send(wire::encode_reply_error(0, e));
}

namespace {

bytes empty_ok(std::uint64_t id) {
  return wire::encode_reply_ok(id, 0, [](byte_writer&) {});
}

}  // namespace

void server_connection::handle(wire::request q) {
  auto& core = *core_;
  std::vector<wake_reply> ready;
  auto bad_key = [&](const std::string& k) {
    auto r = check_key(k);
    if (!r) send(wire::encode_reply_error(q.id, r.error()));
    return !r;
  };
  switch (q.op) {
    case wire::kind::set:
    case wire::kind::set_quiet: {
      bool quiet = q.op == wire::kind::set_quiet;
      if (quiet) {
        // No reply to carry an error: a client that sends a bad key in a quiet set skipped
        // its own check, and the connection is closed with the reason.
        if (auto r = check_key(q.key); !r)
          return close(strcat("a quiet set with a bad key: ", r.error().message()), true);
      } else if (bad_key(q.key)) {
        return;
      }
      {
        std::lock_guard lk(core.mu);
        core.table.set(q.key, q.value);
        core.wake(q.key, ready);
      }
      if (!quiet) send(empty_ok(q.id));
      break;
    }
    case wire::kind::get:
    case wire::kind::wait: {
      bool is_get = q.op == wire::kind::get;
      if (is_get) {
        if (bad_key(q.key)) return;
      } else {
        for (const auto& k : q.keys)
          if (bad_key(k)) return;
      }
      // The common case, keys already there, builds the reply under the lock straight
      // from the table and parks nothing.
      std::optional<bytes> reply;
      bool duplicate = false;
      {
        std::lock_guard lk(core.mu);
        if (is_get) {
          if (const bytes* v = core.table.find(q.key))
            reply = wire::encode_reply_ok(q.id, v->size() + 4, [&](byte_writer& w) { w.blob(*v); });
        } else if (core.table.missing(q.keys).empty()) {
          reply = empty_ok(q.id);
        }
        if (!reply) {
          if (core.waiters.contains({this, q.id})) {
            duplicate = true;
          } else {
            auto w = std::make_shared<parked_request>();
            w->conn = weak_from_this();
            w->owner = this;
            w->id = q.id;
            w->is_get = is_get;
            if (is_get)
              w->keys.push_back(std::move(q.key));
            else
              w->keys = std::move(q.keys);
            core.park(w);
            core.waiters.emplace(std::pair{this, q.id}, std::move(w));
          }
        }
      }
      if (duplicate) return close(strcat("request id ", q.id, " is already waiting"), true);
      if (reply) send(std::move(*reply));
      break;
    }
    case wire::kind::check: {
      for (const auto& k : q.keys)
        if (bad_key(k)) return;
      bool all = false;
      {
        std::lock_guard lk(core.mu);
        all = core.table.missing(q.keys).empty();
      }
      send(wire::encode_reply_ok(q.id, 1, [&](byte_writer& w) { w.u8(all ? 1 : 0); }));
      break;
    }
    case wire::kind::add: {
      if (bad_key(q.key)) return;
      expected<std::int64_t> r;
      {
        std::lock_guard lk(core.mu);
        r = core.table.add(q.key, q.delta);
        if (r) core.wake(q.key, ready);
      }
      if (!r)
        send(wire::encode_reply_error(q.id, r.error()));
      else
        send(wire::encode_reply_ok(q.id, 8, [&](byte_writer& w) { w.i64(*r); }));
      break;
    }
    case wire::kind::compare_set: {
      if (bad_key(q.key)) return;
      bytes now;
      {
        std::lock_guard lk(core.mu);
        now = core.table.compare_set(q.key, q.expected_value, q.value);
        core.wake(q.key, ready);
      }
      send(wire::encode_reply_ok(q.id, now.size() + 4, [&](byte_writer& w) { w.blob(now); }));
      break;
    }
    case wire::kind::erase: {
      if (bad_key(q.key)) return;
      bool existed = false;
      {
        std::lock_guard lk(core.mu);
        existed = core.table.erase(q.key);
      }
      send(wire::encode_reply_ok(q.id, 1, [&](byte_writer& w) { w.u8(existed ? 1 : 0); }));
      break;
    }
    case wire::kind::num_keys: {
      std::int64_t n = 0;
      {
        std::lock_guard lk(core.mu);
        n = q.key.empty() ? core.table.size() : core.table.count_prefix(q.key);
      }
      send(wire::encode_reply_ok(q.id, 8, [&](byte_writer& w) { w.i64(n); }));
      break;
    }
    case wire::kind::cancel:
      core.cancel(this, q.target);
      break;
    default:
      return close(strcat("unexpected frame kind ", int(q.op)), true);
  }
  deliver(ready);
}

// The notifications a write produced, sent at once from this thread: those for
// connections on this loop before the writer's own reply (which waits for the end of its
// batch), those for other loops' connections through send_from_elsewhere(), with no
// thread switch unless their sockets are busy.
void server_connection::deliver(std::vector<wake_reply>& ready) {
  for (auto& d : ready) {
    if (&d.conn->loop() == &loop_)
      d.conn->send(std::move(d.frame));
    else
      d.conn->send_from_elsewhere(std::move(d.frame));
  }
}

bool server_connection::overflows_locked(std::size_t more) {
  if (overflowed_) return true;
  const std::size_t queued = queued_.load(std::memory_order_relaxed);
  if (queued == 0 || queued + more <= core_->options.max_unread_output) return false;
  overflowed_ = true;
  asio::post(loop_, [self = shared_from_this(), queued, more] {
    self->close(
        strcat("it has not read ", queued, " bytes of replies and notifications, and ", more,
               " more would pass max_unread_output (", self->core_->options.max_unread_output,
               " bytes): a client that does not read is dropped and its queue freed"),
        true);
  });
  return true;
}

void server_connection::send_from_elsewhere(bytes frame) {
  {
    std::lock_guard lk(out_mu_);
    if (!open_ || overflows_locked(frame.size())) return;
    if (tls_ && !seal_locked(frame)) return;
    if (!writing_ && out_head_ == outbox_.size()) {
      // Nothing of ours in flight: the frame may go straight onto the socket.
      ssize_t n = 0;
      do {
        n = ::send(fd_, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      } while (n < 0 && errno == EINTR);
      if (n == static_cast<ssize_t>(frame.size())) return;
      // The rest (or, on an error, all of it) goes to the owner loop's flush(), which
      // waits for room or closes the connection with the error.
      if (n > 0) out_offset_ = static_cast<std::size_t>(n);
      account(static_cast<std::ptrdiff_t>(frame.size() - out_offset_));
    } else {
      account(static_cast<std::ptrdiff_t>(frame.size()));
    }
    outbox_.push_back(std::move(frame));
  }
  asio::post(loop_, [self = shared_from_this()] {
    if (!self->closed_ && !self->writing_ && !self->parsing_) self->flush();
  });
}

void server_connection::send(bytes frame) {
  if (closed_) return;
  {
    std::lock_guard lk(out_mu_);
    if (overflows_locked(frame.size())) return;
    if (tls_ && !seal_locked(frame)) return;
    account(static_cast<std::ptrdiff_t>(frame.size()));
    outbox_.push_back(std::move(frame));
  }
  if (!writing_ && !parsing_) flush();
}

// Sends as much of the outbox as the socket takes now, with gathered writes; waits for
// writability for the rest. On the loop; holds out_mu_ only around the outbox and the
// write itself.
void server_connection::flush() {
  std::unique_lock lk(out_mu_);
  if (writing_ || !open_) return;
  while (out_head_ < outbox_.size()) {
    out_buffers_.clear();
    for (std::size_t i = out_head_; i < outbox_.size() && out_buffers_.size() < 64; ++i) {
      std::size_t skip = i == out_head_ ? out_offset_ : 0;
      out_buffers_.push_back(asio::buffer(outbox_[i].data() + skip, outbox_[i].size() - skip));
    }
    boost::system::error_code ec;
    std::size_t n = socket_.write_some(out_buffers_, ec);
    if (ec == asio::error::interrupted) continue;
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      writing_ = true;
      lk.unlock();
      wait_writable();
      lk.lock();
      break;
    }
    if (ec) {
      lk.unlock();
      return close(ec.message(), false);
    }
    account(-static_cast<std::ptrdiff_t>(n));
    while (n > 0) {
      std::size_t left = outbox_[out_head_].size() - out_offset_;
      if (n < left) {
        out_offset_ += n;
        break;
      }
      n -= left;
      bytes().swap(outbox_[out_head_]);
      ++out_head_;
      out_offset_ = 0;
    }
  }
  bool drained = out_head_ == outbox_.size();
  if (drained) {
    outbox_.clear();
    out_head_ = 0;
  }
  lk.unlock();
  if (drained && closing_) return close("refused at hello", false);
  if (read_paused_ && !over_limit() && !parsing_)
    asio::post(loop_, [self = shared_from_this()] { self->resume_reading(); });
}

void server_connection::wait_writable() {
  socket_.async_wait(stream_socket::wait_write,
                     [self = shared_from_this()](boost::system::error_code ec) {
                       if (self->closed_) return;
                       {
                         std::lock_guard lk(self->out_mu_);
                         self->writing_ = false;
                       }
                       if (ec) return self->close(ec.message(), false);
                       self->flush();
                     });
}

void server_connection::close(const std::string& reason, bool warn) {
  if (closed_) return;
  if (warn)
    TROUPE_LOG(log_level::warn, "store", core_->name, ": closing the connection from ", peer_, ": ",
               reason);
  else
    TROUPE_LOG(log_level::debug, "store", core_->name, ": closing the connection from ", peer_,
               ": ", reason);
  // Closing while handling the frames of one read: the replies to the frames before the
  // offending one go out as far as the socket takes them without blocking, as they would
  // have had each frame been read and answered on its own.
  if (parsing_ && !writing_) {
    parsing_ = false;  // let flush() run; this frame's handling ends here
    flush();
    if (closed_) return;
  }
  closed_ = true;
  boost::system::error_code ec;
  timer_.cancel();
  {
    std::lock_guard lk(out_mu_);  // no other loop writes to the socket from here on
    open_ = false;
    fd_ = -1;
    socket_.shutdown(stream_socket::shutdown_both, ec);
    socket_.close(ec);
    outbox_.clear();
    out_head_ = out_offset_ = 0;
    account(-static_cast<std::ptrdiff_t>(queued_.load()));
  }
  core_->forget_connection(this);
}

}  // namespace troupe::detail
