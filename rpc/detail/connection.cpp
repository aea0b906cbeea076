#include "rpc/detail/connection.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace troupe::rpc::detail {

namespace {
constexpr std::size_t read_buffer_size = 256 * 1024;
constexpr std::size_t direct_read_min = 64 * 1024;
constexpr int max_iov = 64;
}  // namespace

connection::connection(socket_type sock, std::weak_ptr<connection_owner> owner, bool outbound,
                       wire::limits lim)
    : socket_(std::move(sock)),
      handshake_timer_(socket_.get_executor()),
      owner_(std::move(owner)),
      outbound_(outbound),
      decoder_(lim),
      read_buf_(read_buffer_size) {
  boost::system::error_code ec;
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  auto ep = socket_.remote_endpoint(ec);
  remote_ = ec ? std::string("unknown") : strcat(ep.address().to_string(), ":", ep.port());
}

connection::~connection() = default;

void connection::start(duration handshake_timeout) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, handshake_timeout] {
    if (!self->outbound_) {
      self->handshake_timer_.expires_after(handshake_timeout);
      self->handshake_timer_.async_wait([self, handshake_timeout](const boost::system::error_code& ec) {
        if (ec) return;
        if (self->peer().name.empty())
          self->do_close(make_error(errc::protocol_error, "connection from ", self->remote_,
                                    " sent no handshake within ", format_duration(handshake_timeout)));
      });
    }
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
  decoder_ = wire::frame_decoder(lim);
}

std::optional<error> connection::sticky_error() const {
  std::lock_guard<std::mutex> lk(wmu_);
  return error_;
}

void connection::mark_peer_leaving() { peer_leaving_.store(true); }

error connection::describe_loss(std::string_view what) const {
  auto p = peer();
  std::string who = p.name.empty() ? strcat("peer at ", remote_) : strcat("worker '", p.name, "'");
  error e = peer_leaving_
                ? make_error(errc::peer_left, who, " left the group (it shut down) before answering")
                : make_error(errc::connection_lost, "connection to ", who, " (", remote_, ") lost: ",
                             what, "; the worker may have died");
  if (!p.name.empty()) e.with_worker(p.name);
  return e;
}

void connection::read_more() {
  auto self = shared_from_this();
  auto window = decoder_.payload_window();
  if (window.size() >= direct_read_min) {
    socket_.async_read_some(asio::buffer(window.data(), window.size()),
                            [self](const boost::system::error_code& ec, std::size_t n) {
                              self->on_read(ec, n, true);
                            });
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
    do_close(describe_loss(ec == asio::error::eof ? "the peer closed it" : ec.message()));
    return;
  }
  expected<void> r = into_window ? decoder_.payload_written(n, ready_)
                                 : decoder_.feed(std::span(read_buf_.data(), n), ready_);
  if (!r) {
    TROUPE_LOG(log_level::warn, "rpc", "closing connection from ", remote_, ": ", r.error().message());
    do_close(std::move(r).error());
    return;
  }
  if (!ready_.empty()) {
    auto owner = owner_.lock();
    std::vector<wire::frame> frames;
    frames.swap(ready_);
    for (auto& f : frames) {
      if (!owner) break;
      owner->on_frame(shared_from_this(), std::move(f));
    }
  }
  {
    std::lock_guard<std::mutex> lk(wmu_);
    if (closed_) return;
  }
  read_more();
}

expected<void> connection::send(wire::frame_builder&& f) {
  std::lock_guard<std::mutex> lk(wmu_);
  if (closed_) return *error_;
  queue_.push_back(out_frame{std::move(f), 0});
  if (queue_.size() > 1 || waiting_writable_) return ok();  // the strand is flushing
  if (auto e = flush_locked()) {
    auto err = *e;
    auto self = shared_from_this();
    asio::post(socket_.get_executor(), [self, err] { self->do_close(err); });
    return err;
  }
  if (!queue_.empty()) {
    waiting_writable_ = true;
    auto self = shared_from_this();
    asio::post(socket_.get_executor(), [self] {
      self->socket_.async_wait(socket_type::wait_write,
                               [self](const boost::system::error_code& ec) { self->on_writable(ec); });
    });
  }
  return ok();
}

std::optional<error> connection::flush_locked() {
  int fd = socket_.native_handle();
  while (!queue_.empty()) {
    iovec iov[max_iov];
    int cnt = 0;
    // Gather from as many queued frames as fit.
    for (auto it = queue_.begin(); it != queue_.end() && cnt < max_iov; ++it) {
      std::size_t skip = it->offset;
      auto add = [&](const void* p, std::size_t len) {
        if (len == 0 || cnt >= max_iov) return;
        if (skip >= len) {
          skip -= len;
          return;
        }
        iov[cnt].iov_base = const_cast<std::byte*>(static_cast<const std::byte*>(p) + skip);
        iov[cnt].iov_len = len - skip;
        skip = 0;
        ++cnt;
      };
      add(it->fb.head().data(), it->fb.head().size());
      for (const auto& t : it->fb.payload()) add(t.data(), t.nbytes());
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(cnt);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
      if (errno == EINTR) continue;
      return describe_loss(std::strerror(errno));
    }
    auto left = static_cast<std::size_t>(w);
    while (left > 0 && !queue_.empty()) {
      auto& front = queue_.front();
      std::size_t remaining = front.fb.size() - front.offset;
      if (left >= remaining) {
        left -= remaining;
        queue_.pop_front();
      } else {
        front.offset += left;
        left = 0;
      }
    }
    // Drop frames that are empty (cannot happen: a frame has at least a header).
  }
  return std::nullopt;
}

void connection::on_writable(const boost::system::error_code& ec) {
  std::optional<error> failure;
  {
    std::lock_guard<std::mutex> lk(wmu_);
    if (closed_) return;
    if (ec) {
      failure = describe_loss(ec.message());
    } else {
      failure = flush_locked();
      if (!failure && !queue_.empty()) {
        auto self = shared_from_this();
        socket_.async_wait(socket_type::wait_write,
                           [self](const boost::system::error_code& e) { self->on_writable(e); });
        return;
      }
      waiting_writable_ = false;
    }
  }
  if (failure) do_close(*failure);
}

void connection::close(error why) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self, why = std::move(why)]() mutable { self->do_close(std::move(why)); });
}

void connection::do_close(error why) {
  error sticky;
  {
    std::lock_guard<std::mutex> lk(wmu_);
    if (!closed_) {
      closed_ = true;
      error_ = std::move(why);
      boost::system::error_code ec;
      socket_.shutdown(socket_type::shutdown_both, ec);
      socket_.close(ec);
      queue_.clear();
    }
    if (notified_) return;
    notified_ = true;
    sticky = *error_;
  }
  handshake_timer_.cancel();
  fail_all(sticky);
  if (auto owner = owner_.lock()) owner->on_closed(shared_from_this(), sticky);
}

expected<void> connection::add_pending(std::uint64_t id, promise<wire::frame>&& p, deadline d) {
  std::lock_guard<std::mutex> lk(pmu_);
  if (pending_error_) return *pending_error_;
  pending_.emplace(id, pending{std::move(p), d.time_point()});
  return ok();
}

bool connection::complete(std::uint64_t id, expected<wire::frame>&& r) {
  promise<wire::frame> p;
  {
    std::lock_guard<std::mutex> lk(pmu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    p = std::move(it->second.p);
    pending_.erase(it);
  }
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
  for (auto& [id, p] : all) p.p.set_error(e);
}

std::size_t connection::pending_count() const {
  std::lock_guard<std::mutex> lk(pmu_);
  return pending_.size();
}

}  // namespace troupe::rpc::detail
