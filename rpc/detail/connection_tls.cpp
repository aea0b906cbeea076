// connection: TLS over memory buffers (see the class comment in connection.hpp and
// docs/security.md). The strand side: the handshake, decryption into the frame decoder, the
// refusal of peers that do not speak TLS. The writer side: encryption of queued frames into
// `cipher_out_`, a chunk at a time, and its non-blocking sends.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <troupe/core/log.hpp>
#include <troupe/rpc/detail/connection.hpp>
#include <troupe/rpc/detail/rpc_metrics.hpp>
#include <troupe/rpc/serializer.hpp>

namespace troupe::rpc::detail {

namespace {
// Plaintext the writer encrypts per turn of its loop before it sends: large enough to keep
// the syscalls few, small enough that sending starts early and the buffer stays small.
constexpr std::size_t tls_chunk = 256 * 1024;
// Pieces smaller than this are copied together and encrypted as one record.
constexpr std::size_t tls_small_piece = 16 * 1024;
constexpr std::size_t plain_buffer_size = 64 * 1024;
constexpr std::size_t direct_read_min = 64 * 1024;
constexpr std::string_view tls_settings = "TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA";

// Whether `b` starts with an RPC frame's magic: the peer speaks plain RPC.
bool plain_rpc(std::span<const std::byte> b) {
  if (b.size() < 4) return false;
  std::uint32_t m = 0;
  for (int i = 3; i >= 0; --i)
    m = (m << 8) | std::to_integer<std::uint32_t>(b[static_cast<std::size_t>(i)]);
  return m == wire::magic;
}
}  // namespace

error connection::tls_mismatch(bool closed_in_handshake) const {
  if (!tls_)
    return make_error(errc::unauthorized, "refused a TLS connection from ", remote_,
                      ": this worker does not use TLS; set ", tls_settings,
                      " on every worker of the job, or on none");
  if (closed_in_handshake)
    return make_error(
        errc::unauthorized, "the peer at ", remote_,
        " closed the connection during the TLS handshake: it does not use TLS, or it "
        "refused this worker's certificate; set ",
        tls_settings,
        " on every worker of the job (certificates signed by the same CA), or on none");
  if (outbound_)
    return make_error(errc::unauthorized, "the peer at ", remote_,
                      " answered without TLS: it does not use TLS and this worker does; set ",
                      tls_settings, " on every worker of the job, or on none");
  return make_error(errc::unauthorized, "refused a connection without TLS from ", remote_,
                    ": this worker requires TLS; give that worker the job's certificate (set ",
                    tls_settings, " on every worker of the job, or on none)");
}

void connection::tls_start() {
  if (!outbound_) return;  // the server waits for the ClientHello
  expected<bool> r = false;
  {
    std::lock_guard<std::mutex> lk(tls_mu_);
    r = tls_->handshake();  // writes the ClientHello
  }
  if (!r) {
    do_close(std::move(r).error(), true);
    return;
  }
  kick_writer();
}

bool connection::tls_input(std::size_t n) {
  std::span<const std::byte> in(read_buf_.data(), n);
  const bool first = std::exchange(nothing_read_, false);
  if (first && !tls_ready_.load() && plain_rpc(in)) {
    error e = tls_mismatch(false);
    if (!outbound_) {
      // Tell the plain caller why, in its own protocol, before closing.
      TROUPE_LOG(log_level::warn, "rpc", e.message());
      wire::frame_builder fb(wire::kind::error, 0);
      error theirs = make_error(
          errc::unauthorized, "the peer requires TLS and refused this connection without it: set ",
          tls_settings,
          " on every worker of the job (certificates signed by "
          "the job's CA), or on none");
      if (serialize(fb.message(), nullptr, theirs) && fb.finish())
        (void)::send(socket_.native_handle(), fb.head().data(), fb.head().size(),
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    do_close(std::move(e));
    return false;
  }
  std::optional<error> failure;
  bool became_ready = false;
  std::string negotiated;
  {
    std::lock_guard<std::mutex> lk(tls_mu_);
    tls_->put_input(in);
    if (!tls_->established()) {
      auto h = tls_->handshake();
      if (!h)
        failure = std::move(h).error();
      else
        became_ready = *h;
      if (became_ready) negotiated = tls_->describe();
    }
  }
  if (failure) {
    error e =
        make_error(failure->code(), outbound_ ? "connecting to the peer at " : "connection from ",
                   remote_, ": ", failure->message());
    if (!outbound_) TROUPE_LOG(log_level::warn, "rpc", e.message());
    do_close(std::move(e), true);  // sends our alert first
    return false;
  }
  if (became_ready) {
    tls_ready_.store(true);
    TROUPE_LOG(log_level::debug, "rpc", "TLS established with ", remote_, " (", negotiated, ")");
  }
  if (tls_ready_.load()) {
    if (plain_in_.empty()) plain_in_.resize(plain_buffer_size);
    for (;;) {
      auto window = decoder_.payload_window();
      const bool direct = window.size() >= direct_read_min;
      std::span<std::byte> to = direct ? window : std::span<std::byte>(plain_in_);
      expected<std::size_t> got = std::size_t{0};
      {
        std::lock_guard<std::mutex> lk(tls_mu_);
        got = tls_->read(to);
      }
      expected<void> r;
      if (!got) {
        r = make_error(got.error().code(), "connection with ", remote_, ": ",
                       got.error().message());
      } else if (*got == 0) {
        break;
      } else {
        r = direct ? decoder_.payload_written(*got, ready_)
                   : decoder_.feed(std::span<const std::byte>(plain_in_.data(), *got), ready_);
        if (!r)
          r = make_error(r.error().code(), "connection with ", remote_, ": ", r.error().message());
      }
      if (!r) {
        if (r.error().code() == errc::connection_lost) {
          do_close(describe_loss("the peer closed its TLS session"));
        } else {
          TROUPE_LOG(log_level::warn, "rpc", "closing a TLS ", r.error().message());
          do_close(std::move(r).error());
        }
        return false;
      }
    }
  }
  kick_writer();  // handshake records to answer, or frames that waited for the handshake
  return true;
}

bool connection::has_work_locked() const {
  if (!tls_) return !queue_.empty();
  if (cipher_sent_ < cipher_out_.size()) return true;
  if (tls_ready_.load() && !queue_.empty()) return true;
  std::lock_guard<std::mutex> lk(tls_mu_);
  return tls_->output_size() > 0;
}

void connection::kick_writer() {
  std::lock_guard<std::mutex> lk(wmu_);
  if (closed_ || writing_ || waiting_writable_) return;  // they run another turn when done
  if (has_work_locked()) schedule_flush_locked();
}

connection::write_result connection::write_queue_tls(std::unique_lock<std::mutex>& lk,
                                                     std::uint64_t until_popped,
                                                     std::optional<error>& failure,
                                                     written_list& done) {
  const int fd = socket_.native_handle();
  for (;;) {
    if (closed_) return write_result::done;
    // Send what is encrypted first.
    if (cipher_sent_ < cipher_out_.size()) {
      const std::byte* p = cipher_out_.data() + cipher_sent_;
      const std::size_t len = cipher_out_.size() - cipher_sent_;
      lk.unlock();
      ssize_t w = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      const int err = errno;
      lk.lock();
      if (w < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK) return write_result::would_block;
        if (err == EINTR) continue;
        failure = describe_loss(std::strerror(err));
        return write_result::failed;
      }
      const auto sent = static_cast<std::size_t>(w);
      rpc_stats().bytes_sent.add(sent);
      cipher_sent_ += sent;
      queued_bytes_ -= sent;
      if (cipher_sent_ == cipher_out_.size()) {
        cipher_out_.clear();
        cipher_sent_ = 0;
      }
      if (queued_bytes_ < max_queued_) wcv_.notify_all();
      continue;
    }
    // Refill: the next chunk of queued frames once the handshake is done, and whatever
    // the session has to send (handshake records, alerts), in the order it made them.
    const bool encrypt = tls_ready_.load() && !queue_.empty() && popped_ < until_popped;
    std::vector<std::span<const std::byte>> pieces;
    std::size_t taken = 0;
    if (encrypt) {
      // Elements of a deque stay where they are while others append, and only this writer
      // pops, so these pointers stay valid with wmu_ released.
      for (auto it = queue_.begin(); it != queue_.end() && taken < tls_chunk; ++it) {
        std::size_t skip = it->offset;
        auto add = [&](const void* data, std::size_t len) {
          if (len == 0 || taken >= tls_chunk) return;
          if (skip >= len) {
            skip -= len;
            return;
          }
          const std::size_t n = std::min(len - skip, tls_chunk - taken);
          pieces.emplace_back(static_cast<const std::byte*>(data) + skip, n);
          taken += n;
          skip = 0;
        };
        add(it->fb.head().data(), it->fb.head().size());
        for (const auto& t : it->fb.payload()) add(t.data(), t.nbytes());
      }
    }
    lk.unlock();
    expected<void> wrote;
    {
      std::lock_guard<std::mutex> tl(tls_mu_);
      stage_.clear();
      for (const auto& piece : pieces) {
        if (piece.size() < tls_small_piece) {
          stage_.insert(stage_.end(), piece.begin(), piece.end());
          if (stage_.size() < tls_small_piece) continue;
          wrote = tls_->write(stage_);
          stage_.clear();
        } else {
          if (!stage_.empty()) wrote = tls_->write(stage_);
          stage_.clear();
          if (wrote) wrote = tls_->write(piece);
        }
        if (!wrote) break;
      }
      if (wrote && !stage_.empty()) wrote = tls_->write(stage_);
      (void)tls_->take_output(cipher_out_);
    }
    lk.lock();
    if (!wrote) {
      failure = std::move(wrote).error();
      return write_result::failed;
    }
    // Frames whose bytes are all encrypted are written: their memory may be reused.
    queued_bytes_ += cipher_out_.size();
    queued_bytes_ -= taken;
    while (taken > 0 && !queue_.empty()) {
      auto& front = queue_.front();
      const std::size_t remaining = front.fb.size() - front.offset;
      if (taken >= remaining) {
        taken -= remaining;
        if (front.written) done.push_back(std::move(*front.written));
        queue_.pop_front();
        ++popped_;
      } else {
        front.offset += taken;
        taken = 0;
      }
    }
    if (cipher_out_.empty()) return write_result::done;
  }
}

}  // namespace troupe::rpc::detail
