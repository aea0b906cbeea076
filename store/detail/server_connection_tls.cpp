// server_connection: TLS over memory buffers (see the class comment in
// server_connection.hpp and docs/security.md, "TLS between hosts"). The input side: the
// refusal of clients without TLS, the handshake, decryption into in_. The output side:
// each frame is encrypted as it is queued (seal_locked), and what the session has to send
// on its own (handshake records, alerts) joins the outbox in order.
#include <utility>

#include <troupe/core/log.hpp>
#include <troupe/store/detail/server_connection.hpp>

namespace troupe::detail {

namespace asio = boost::asio;

namespace {
// A TLS record of type 22 (handshake) starts every ClientHello.
constexpr std::byte tls_handshake_record{0x16};
}  // namespace

// Ciphertext just read into cipher_in_: the first bytes must open a TLS handshake; then the
// handshake advances, and once it is complete the plaintext is parsed as frames. False when
// reading must not go on.
bool server_connection::tls_input(std::size_t n) {
  std::span<const std::byte> in(cipher_in_.data(), n);
  if (std::exchange(first_read_, false) && (n == 0 || in[0] != tls_handshake_record)) {
    refuse_plain_client(in);
    return false;
  }
  std::optional<error> failure;
  bool became_ready = false;
  std::string negotiated;
  {
    std::lock_guard lk(out_mu_);
    if (!open_) return false;
    tls_->put_input(in);
    if (!tls_->established()) {
      auto h = tls_->handshake();
      if (!h) {
        failure = std::move(h).error();
      } else if (*h) {
        became_ready = true;
        negotiated = tls_->describe();
      }
      take_tls_output_locked();  // the server's flight, or the alert of a refusal
    }
  }
  if (failure) {
    tls_refuse(*failure);
    return false;
  }
  if (became_ready)
    TROUPE_LOG(log_level::debug, "store", core_->name, ": TLS established with ", peer_, " (",
               negotiated, ")");
  if (!writing_) flush();
  if (closed_) return false;
  return tls_drain();
}

// Decrypts what the session holds into in_ and answers the frames, until it holds no whole
// record. False when reading must not go on (closed, refusing, or paused by too many unsent
// replies: resume_reading() comes back here through read_now()).
bool server_connection::tls_drain() {
  if (!tls_->established()) return true;
  for (;;) {
    if (closed_ || closing_) return false;
    std::size_t room = prepare_read();
    expected<std::size_t> got = std::size_t{0};
    {
      std::lock_guard lk(out_mu_);
      if (!open_) return false;
      got = tls_->read(std::span<std::byte>(in_.data() + in_end_, room));
      take_tls_output_locked();
    }
    if (!got) {
      bool mid_frame = in_end_ - in_begin_ >= wire::length_size;
      if (got.error().code() == errc::connection_lost)
        close(mid_frame ? "the peer closed its TLS session in the middle of a frame"
                        : "the peer closed its TLS session",
              mid_frame);
      else
        close(got.error().message(), true);
      return false;
    }
    if (*got == 0) break;
    in_end_ += *got;
    if (!process()) return false;
  }
  if (!writing_ && !parsing_) flush();  // anything the session had to say
  return !closed_;
}

// A TLS server whose client opened with something else: a plain troupe store client gets
// a plain error reply (it reads it as the answer to its hello), anyone else the close.
void server_connection::refuse_plain_client(std::span<const std::byte> first) {
  const bool store_client =
      first.size() >= wire::length_size + 1 &&
      first[wire::length_size] == std::byte{static_cast<std::uint8_t>(wire::kind::hello)};
  TROUPE_LOG(log_level::warn, "store", core_->name, ": refusing ", peer_,
             ": a connection without TLS", store_client ? " (a troupe store client)" : "",
             "; this server requires TLS: set TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA "
             "on every client too (certificates signed by the server's CA), or on neither side");
  if (store_client) {
    bytes reply = wire::encode_reply_error(
        0, make_error(errc::unauthorized,
                      "the store server requires TLS and refused this client, which has none: set "
                      "TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA on both sides (the store "
                      "server and every client, certificates signed by the same CA), or on "
                      "neither"));
    std::lock_guard lk(out_mu_);
    account(static_cast<std::ptrdiff_t>(reply.size()));
    outbox_.push_back(std::move(reply));  // plain bytes, outside TLS
  }
  closing_ = true;
  flush();  // closes once the reply is out
}

// The handshake failed (a certificate refused, or not TLS after all): logged, the session's
// alert sent, then the connection closed.
void server_connection::tls_refuse(const error& e) {
  TROUPE_LOG(log_level::warn, "store", core_->name, ": refusing ", peer_, ": ", e.message());
  closing_ = true;
  flush();
}

bool server_connection::seal_locked(bytes& frame) {
  if (auto w = tls_->write(frame); !w) {
    asio::post(loop_, [self = shared_from_this(), why = w.error().message()] {
      self->close(strcat("cannot encrypt a reply: ", why), true);
    });
    return false;
  }
  bytes sealed;
  tls_->take_output(sealed);
  frame.swap(sealed);
  return true;
}

void server_connection::take_tls_output_locked() {
  if (tls_->output_size() == 0) return;
  bytes out;
  tls_->take_output(out);
  account(static_cast<std::ptrdiff_t>(out.size()));
  outbox_.push_back(std::move(out));
}

}  // namespace troupe::detail
