#include <troupe/rpc/detail/connection.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <troupe/core/log.hpp>
#include <troupe/rpc/detail/rpc_metrics.hpp>
#include <troupe/rpc/device_helper.hpp>
#include <troupe/rpc/function_table.hpp>

namespace troupe::rpc::detail {

namespace {
constexpr std::size_t read_buffer_size = 256 * 1024;
constexpr std::size_t direct_read_min = 64 * 1024;
// While an I/O thread hands the frames of one read to the owner: what runs after them.
thread_local std::vector<std::function<void()>>* batch_hooks = nullptr;
}  // namespace

connection::connection(socket_type sock, std::weak_ptr<connection_owner> owner, bool outbound,
                       wire::limits lim, std::size_t max_queued_bytes,
                       std::unique_ptr<tls::session> tls)
    : socket_(std::move(sock)),
      handshake_timer_(socket_.get_executor()),
      owner_(std::move(owner)),
      outbound_(outbound),
      decoder_(lim),
      read_buf_(read_buffer_size),
      tls_(std::move(tls)),
      max_queued_(max_queued_bytes == 0 ? default_max_queued_bytes : max_queued_bytes) {
  boost::system::error_code ec;
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  if (::getpeername(socket_.native_handle(), reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
    remote_ = "unknown";
  } else if (peer.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t clen = sizeof cred;
    remote_ = ::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0
                  ? strcat("local process ", cred.pid)
                  : std::string("a local process");
  } else {
    socket_.set_option(asio::ip::tcp::no_delay(true), ec);
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr = nullptr;
    unsigned port = 0;
    if (peer.ss_family == AF_INET) {
      auto* in = reinterpret_cast<const sockaddr_in*>(&peer);
      addr = &in->sin_addr;
      port = ntohs(in->sin_port);
    } else {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(&peer);
      addr = &in6->sin6_addr;
      port = ntohs(in6->sin6_port);
    }
    remote_ = ::inet_ntop(peer.ss_family, addr, text, sizeof text) ? strcat(text, ":", port)
                                                                   : std::string("unknown");
  }
}

connection::~connection() = default;

void connection::start(duration handshake_timeout) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, handshake_timeout] {
    if (!self->outbound_) {
      self->handshake_timer_.expires_after(handshake_timeout);
      self->handshake_timer_.async_wait(
          [self, handshake_timeout](const boost::system::error_code& ec) {
            if (ec) return;
            if (self->peer().name.empty())
              self->do_close(make_error(errc::protocol_error, "connection from ", self->remote_,
                                        " sent no handshake within ",
                                        format_duration(handshake_timeout)));
          });
    }
    if (self->tls_) self->tls_start();
    self->read_more();
  });
}

worker_info connection::peer() const {
  std::lock_guard<std::mutex> lk(pmu_);
  return peer_;
}

void connection::set_peer(worker_info w) {
  {
    std::lock_guard<std::mutex> lk(pmu_);
    peer_ = std::move(w);
  }
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self] { self->handshake_timer_.cancel(); });
}

void connection::set_limits(wire::limits lim) {
  // Called on the strand (from the handshake handler), between frames.
  decoder_ = wire::frame_decoder(lim, &receive_buffer);
}

std::optional<error> connection::sticky_error() const {
  std::lock_guard<std::mutex> lk(wmu_);
  return error_;
}

void connection::mark_peer_leaving() { peer_leaving_.store(true); }

void connection::note_shutdown_notice() {
  peer_leaving_.store(true);
  notice_seen_.store(true);
}

error connection::describe_loss(std::string_view what) const {
  auto p = peer();
  std::string who = p.name.empty() ? strcat("peer at ", remote_) : strcat("worker '", p.name, "'");
  error e = peer_leaving_ ? make_error(errc::peer_left, who,
                                       " left the group (it shut down) before answering")
                          : make_error(errc::connection_lost, "connection to ", who, " (", remote_,
                                       ") lost: ", what, "; the worker may have died");
  if (!p.name.empty()) e.with_worker(p.name);
  return e;
}

void connection::read_more() {
  auto self = shared_from_this();
  auto window = decoder_.payload_window();
  // TLS reads ciphertext into read_buf_; tls_input decrypts straight into the window.
  if (!tls_ && window.size() >= direct_read_min) {
    socket_.async_read_some(
        asio::buffer(window.data(), window.size()),
        [self](const boost::system::error_code& ec, std::size_t n) { self->on_read(ec, n, true); });
  } else {
    socket_.async_read_some(asio::buffer(read_buf_),
                            [self](const boost::system::error_code& ec, std::size_t n) {
                              self->on_read(ec, n, false);
                            });
  }
}

void connection::on_read(const boost::system::error_code& ec, std::size_t n, bool into_window) {
  if (ec) {
    {
      std::lock_guard<std::mutex> lk(wmu_);
      if (closed_) return;
    }
    if (tls_ && !tls_ready_.load()) {
      auto e = tls_mismatch(true);
      if (!outbound_) TROUPE_LOG(log_level::warn, "rpc", e.message());
      do_close(std::move(e));
      return;
    }
    do_close(describe_loss(ec == asio::error::eof ? "the peer closed it" : ec.message()));
    return;
  }
  rpc_stats().bytes_received.add(n);
  expected<void> r;
  if (tls_) {
    if (!tls_input(n)) return;
  } else {
    // A TLS ClientHello (a handshake record, 0x16 0x03) where RPC frames were expected.
    if (nothing_read_ && !into_window && n >= 2 && read_buf_[0] == std::byte{0x16} &&
        read_buf_[1] == std::byte{0x03})
      r = tls_mismatch(false);
    else
      r = into_window ? decoder_.payload_written(n, ready_)
                      : decoder_.feed(std::span(read_buf_.data(), n), ready_);
    nothing_read_ = false;
  }
  if (!r) {
    TROUPE_LOG(log_level::warn, "rpc", "closing connection from ", remote_, ": ",
               r.error().message());
    do_close(std::move(r).error());
    return;
  }
  if (!ready_.empty()) {
    auto owner = owner_.lock();
    std::vector<wire::frame> frames;
    frames.swap(ready_);
    std::vector<std::function<void()>> hooks;
    auto* outer = std::exchange(batch_hooks, &hooks);
    for (auto& f : frames) {
      if (!owner) break;
      owner->on_frame(shared_from_this(), std::move(f));
    }
    batch_hooks = outer;
    for (auto& h : hooks) h();
  }
  {
    std::lock_guard<std::mutex> lk(wmu_);
    if (closed_) return;
  }
  read_more();
}

expected<void> connection::add_pending(std::uint64_t id, promise<wire::frame>&& p, deadline d) {
  std::lock_guard<std::mutex> lk(pmu_);
  if (pending_error_) return *pending_error_;
  pending_.emplace(id, pending{std::move(p), d.time_point(), clock::now()});
  auto& m = rpc_stats();
  m.client_calls.add();
  m.pending.add(1);
  return ok();
}

bool connection::complete(std::uint64_t id, expected<wire::frame>&& r) {
  promise<wire::frame> p;
  clock::time_point started;
  {
    std::lock_guard<std::mutex> lk(pmu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    p = std::move(it->second.p);
    started = it->second.started;
    pending_.erase(it);
  }
  auto& m = rpc_stats();
  m.pending.add(-1);
  m.client_latency.observe(clock::now() - started);
  if (!r) m.client_errors.add();
  p.set(std::move(r));
  return true;
}

void connection::expire(clock::time_point now) {
  std::vector<promise<wire::frame>> expired;
  std::string who;
  {
    std::lock_guard<std::mutex> lk(pmu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.at <= now) {
        expired.push_back(std::move(it->second.p));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    who = peer_.name;
  }
  if (!expired.empty()) {
    auto& m = rpc_stats();
    m.pending.add(-static_cast<std::int64_t>(expired.size()));
    m.client_errors.add(expired.size());
  }
  for (auto& p : expired)
    p.set_error(make_error(errc::timeout, "no answer from worker '", who,
                           "' before the call's deadline; raise the call's timeout or the "
                           "agent's rpc_timeout if the function is slow")
                    .with_worker(who));
}

void connection::fail_all(const error& e) {
  std::map<std::uint64_t, pending> all;
  {
    std::lock_guard<std::mutex> lk(pmu_);
    pending_error_ = e;
    all.swap(pending_);
  }
  if (!all.empty()) {
    auto& m = rpc_stats();
    m.pending.add(-static_cast<std::int64_t>(all.size()));
    m.client_errors.add(all.size());
  }
  for (auto& [id, p] : all) p.p.set_error(e);
}

std::size_t connection::pending_count() const {
  std::lock_guard<std::mutex> lk(pmu_);
  return pending_.size();
}

}  // namespace troupe::rpc::detail

namespace troupe::rpc {

bool at_end_of_read_batch(std::function<void()> fn) {
  if (detail::batch_hooks == nullptr) return false;
  detail::batch_hooks->push_back(std::move(fn));
  return true;
}

}  // namespace troupe::rpc
