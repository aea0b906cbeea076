// connection: the write side (queue, writer turns, write combining, backpressure, drain
// and close). See the class comment in connection.hpp.
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <troupe/core/log.hpp>
#include <troupe/rpc/detail/connection.hpp>
#include <troupe/rpc/detail/rpc_metrics.hpp>

namespace troupe::rpc::detail {

namespace {
constexpr int max_iov = 64;
thread_local bool on_io_thread = false;
}  // namespace

bool is_io_thread() noexcept { return on_io_thread; }
void mark_io_thread() { on_io_thread = true; }

std::size_t connection::queued_bytes() const {
  std::lock_guard<std::mutex> lk(wmu_);
  return queued_bytes_;
}

error connection::queue_full_error() const {
  auto p = peer();
  std::string who =
      p.name.empty() ? strcat("the peer at ", remote_) : strcat("worker '", p.name, "'");
  error e = make_error(errc::timeout, "the send queue to ", who, " stayed full (", queued_bytes_,
                       " bytes waiting, limit ", max_queued_,
                       ") until the call's deadline: it reads slower than this worker sends; send "
                       "less at a time, raise the call's timeout or max_queued_bytes");
  if (!p.name.empty()) e.with_worker(p.name);
  return e;
}

expected<void> connection::send(wire::frame_builder&& f, write_mode mode, deadline until,
                                std::optional<promise<void>> written) {
  std::unique_lock<std::mutex> lk(wmu_);
  if (closed_) return *error_;
  if (on_io_thread && queued_bytes_ >= 2 * max_queued_) {
    // An I/O thread cannot wait for room, so what it sends (replies of inline functions,
    // errors, acknowledgements) could pile up without bound behind a peer that sends and
    // never reads. Past twice the limit that peer is dropped.
    auto p = peer();
    std::string who =
        p.name.empty() ? strcat("the peer at ", remote_) : strcat("worker '", p.name, "'");
    error e =
        make_error(errc::unavailable, who, " does not read what this worker sends: ", queued_bytes_,
                   " bytes wait in its send queue, twice the limit (", max_queued_,
                   " bytes, rpc_backend_options::max_queued_bytes); dropped "
                   "the connection");
    lk.unlock();
    TROUPE_LOG(log_level::warn, "rpc", e.message());
    do_close(e, false);
    return e;
  }
  if (queued_bytes_ >= max_queued_ && !on_io_thread) {
    // An I/O thread never waits here: it may be the thread that has to drain the queue.
    bool room = wcv_.wait_until(lk, until.time_point(),
                                [this] { return closed_ || queued_bytes_ < max_queued_; });
    if (closed_) return *error_;
    if (!room) return queue_full_error();
  }
  queued_bytes_ += f.size();
  queue_.push_back(out_frame{std::move(f), 0, std::move(written)});
  const std::uint64_t mine = ++pushed_;
  if (writing_ || waiting_writable_) return ok();  // the active writer or the strand takes it
  if (mode == write_mode::combine) {
    schedule_flush_locked();
    return ok();
  }
  if (auto failure = write_turn(lk, mine)) return *failure;
  return ok();
}

std::optional<error> connection::write_turn(std::unique_lock<std::mutex>& lk,
                                            std::uint64_t until_popped) {
  writing_ = true;
  std::optional<error> failure;
  written_list done;
  auto r = write_queue(lk, until_popped, failure, done);
  end_write(lk, r, failure);
  lk.unlock();
  for (auto& p : done) p.set_value();
  return failure;
}

void connection::schedule_flush_locked() {
  if (flush_posted_) return;
  flush_posted_ = true;
  auto self = shared_from_this();
  asio::post(socket_.get_executor(), [self] { self->flush_on_strand(); });
}

void connection::flush_on_strand() {
  std::unique_lock<std::mutex> lk(wmu_);
  flush_posted_ = false;
  if (closed_ || writing_ || waiting_writable_ || !has_work_locked()) return;
  (void)write_turn(lk, pushed_);  // a failure closes the connection; nobody to tell here
}

connection::write_result connection::write_queue(std::unique_lock<std::mutex>& lk,
                                                 std::uint64_t until_popped,
                                                 std::optional<error>& failure,
                                                 written_list& done) {
  if (tls_) return write_queue_tls(lk, until_popped, failure, done);
  const int fd = socket_.native_handle();
  while (!queue_.empty() && popped_ < until_popped) {
    if (closed_) return write_result::done;
    iovec iov[max_iov];
    int cnt = 0;
    // Gather from as many queued frames as fit. Elements of a deque stay where they are
    // while others append, and only this writer pops, so the pointers stay valid below.
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
    lk.unlock();
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    lk.lock();
    if (w < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK) return write_result::would_block;
      if (err == EINTR) continue;
      failure = describe_loss(std::strerror(err));
      return write_result::failed;
    }
    auto left = static_cast<std::size_t>(w);
    rpc_stats().bytes_sent.add(left);
    queued_bytes_ -= left;
    while (left > 0 && !queue_.empty()) {
      auto& front = queue_.front();
      std::size_t remaining = front.fb.size() - front.offset;
      if (left >= remaining) {
        left -= remaining;
        if (front.written) done.push_back(std::move(*front.written));
        queue_.pop_front();
        ++popped_;
      } else {
        front.offset += left;
        left = 0;
      }
    }
    if (queued_bytes_ < max_queued_) wcv_.notify_all();
  }
  return write_result::done;
}

void connection::end_write(std::unique_lock<std::mutex>&, write_result r,
                           std::optional<error> failure) {
  writing_ = false;
  wcv_.notify_all();  // do_close may wait for the writer to finish
  if (closed_) return;
  if (r == write_result::failed) {
    auto self = shared_from_this();
    asio::post(socket_.get_executor(), [self, err = *failure] { self->do_close(err); });
    return;
  }
  if (r == write_result::would_block) {
    waiting_writable_ = true;
    auto self = shared_from_this();
    asio::post(socket_.get_executor(), [self] {
      self->socket_.async_wait(
          socket_type::wait_write,
          [self](const boost::system::error_code& ec) { self->on_writable(ec); });
    });
    return;
  }
  // Frames that others queued while this writer wrote its own go with the strand (and,
  // with TLS, records the strand's reads made meanwhile).
  if (has_work_locked()) schedule_flush_locked();
}

void connection::on_writable(const boost::system::error_code& ec) {
  std::unique_lock<std::mutex> lk(wmu_);
  waiting_writable_ = false;
  if (closed_) return;
  if (ec) {
    auto failure = describe_loss(ec.message());
    lk.unlock();
    do_close(failure);
    return;
  }
  if (writing_) return;           // that writer hands what is left on when it ends
  (void)write_turn(lk, pushed_);  // a failure closes the connection
}

void connection::drain(std::unique_lock<std::mutex>& lk, deadline until, written_list& done) {
  wcv_.wait_until(lk, until.time_point(), [this] { return !writing_; });
  if (writing_) return;
  writing_ = true;
  for (;;) {
    std::optional<error> failure;
    auto r = write_queue(lk, pushed_, failure, done);
    if (r != write_result::would_block || until.expired()) break;
    lk.unlock();
    pollfd p{socket_.native_handle(), POLLOUT, 0};
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until.remaining()).count();
    (void)::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(ms, 1, 100)));
    lk.lock();
  }
  writing_ = false;
  wcv_.notify_all();
}

void connection::close(error why) {
  auto self = shared_from_this();
  asio::post(socket_.get_executor(),
             [self, why = std::move(why)]() mutable { self->do_close(std::move(why), true); });
}

void connection::do_close(error why, bool drain_first) {
  error sticky;
  written_list done;
  std::vector<promise<void>> dropped;
  {
    std::unique_lock<std::mutex> lk(wmu_);
    if (!closed_) {
      // With TLS, records the session still has to send (an alert saying why) go too.
      if (drain_first && (!queue_.empty() || tls_)) drain(lk, deadline::after(drain_timeout), done);
      closed_ = true;
      error_ = std::move(why);
      // No writer may be inside sendmsg when the descriptor closes.
      wcv_.wait(lk, [this] { return !writing_; });
      boost::system::error_code ec;
      socket_.shutdown(socket_type::shutdown_both, ec);
      socket_.close(ec);
      // (Frames that waited for a TLS handshake that failed were never meant to go.)
      if (!queue_.empty() && (!tls_ || tls_ready_.load())) {
        auto p = peer();
        TROUPE_LOG(log_level::warn, "rpc", queue_.size(), " frames (", queued_bytes_,
                   " bytes) queued for ",
                   p.name.empty() ? remote_ : strcat("worker '", p.name, "'"),
                   " were not sent: ", error_->message());
      }
      for (auto& f : queue_)
        if (f.written) dropped.push_back(std::move(*f.written));
      queue_.clear();
      queued_bytes_ = 0;
      cipher_out_.clear();
      cipher_sent_ = 0;
      wcv_.notify_all();  // senders blocked on a full queue fail with the sticky error
    }
    sticky = *error_;
    if (notified_) {
      lk.unlock();
      for (auto& p : done) p.set_value();
      return;
    }
    notified_ = true;
  }
  for (auto& p : done) p.set_value();
  for (auto& p : dropped) p.set_error(sticky);
  handshake_timer_.cancel();
  fail_all(sticky);
  if (auto owner = owner_.lock()) owner->on_closed(shared_from_this(), sticky);
}

}  // namespace troupe::rpc::detail
