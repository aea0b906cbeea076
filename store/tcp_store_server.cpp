// The TCP store server: one io_context on one thread, a strand per connection, and a
// shared table guarded by one mutex that is never held while touching a socket.
#include <utility>  // before Asio, for g++ 12

#include "store/tcp_store_server.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>

#include "core/log.hpp"
#include "store/detail/kv_table.hpp"
#include "store/detail/wire.hpp"

namespace troupe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace wire = detail::wire;

namespace {

class connection;

// A request whose reply waits for keys to appear (get and wait).
struct waiter {
  std::weak_ptr<connection> conn;
  const connection* owner = nullptr;
  std::uint64_t id = 0;
  bool is_get = false;
  std::vector<std::string> keys;
  std::string parked_on;
};

// A reply ready to go to some connection.
struct delivery {
  std::shared_ptr<connection> conn;
  bytes frame;
};

// Everything the connections share. Lives as long as the last connection.
struct shared_core {
  tcp_store_server_options options;
  std::string name;

  std::mutex mu;
  detail::kv_table table;
  std::unordered_map<std::string, std::vector<std::shared_ptr<waiter>>> parked;
  std::map<std::pair<const connection*, std::uint64_t>, std::shared_ptr<waiter>> waiters;
  std::unordered_map<const connection*, std::weak_ptr<connection>> connections;
  std::atomic<std::size_t> queued_output{0};  // bytes in every connection's outbox

  // Under mu: parks `w` on its first missing key, or returns false if none is missing.
  bool park(const std::shared_ptr<waiter>& w) {
    for (const auto& k : w->keys) {
      if (!table.contains(k)) {
        w->parked_on = k;
        parked[k].push_back(w);
        return true;
      }
    }
    return false;
  }

  // Under mu: the replies for waiters that `key` completed; re-parks the others.
  void wake(const std::string& key, std::vector<delivery>& out) {
    auto it = parked.find(key);
    if (it == parked.end() || !table.contains(key)) return;
    auto list = std::move(it->second);
    parked.erase(it);
    for (auto& w : list) {
      if (park(w)) continue;
      waiters.erase({w->owner, w->id});
      auto conn = w->conn.lock();
      if (!conn) continue;
      if (w->is_get) {
        const bytes* v = table.find(w->keys.front());
        out.push_back(
            {std::move(conn), wire::encode_reply_ok(w->id, [&](byte_writer& wr) { wr.blob(*v); })});
      } else {
        out.push_back({std::move(conn), wire::encode_reply_ok(w->id, [](byte_writer&) {})});
      }
    }
  }

  // Under mu: forgets one waiter.
  void drop(const std::shared_ptr<waiter>& w) {
    auto it = parked.find(w->parked_on);
    if (it != parked.end()) {
      std::erase(it->second, w);
      if (it->second.empty()) parked.erase(it);
    }
  }

  void cancel(const connection* c, std::uint64_t id) {
    std::lock_guard lk(mu);
    auto it = waiters.find({c, id});
    if (it == waiters.end()) return;
    drop(it->second);
    waiters.erase(it);
  }

  void forget_connection(const connection* c) {
    std::lock_guard lk(mu);
    auto it = waiters.lower_bound({c, 0});
    while (it != waiters.end() && it->first.first == c) {
      drop(it->second);
      it = waiters.erase(it);
    }
    connections.erase(c);
  }
};

void deliver(std::vector<delivery>& ready);

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(tcp::socket socket, std::shared_ptr<shared_core> core)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), core_(std::move(core)) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("an unknown peer") : strcat(ep.address().to_string(), ":", ep.port());
  }

  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->timer_.expires_after(self->core_->options.hello_timeout);
      self->timer_.async_wait([self](boost::system::error_code ec) {
        if (!ec && !self->authenticated_)
          self->close(
              strcat("no hello within ", format_duration(self->core_->options.hello_timeout)),
              true);
      });
      self->read_more();
    });
  }

  // On the strand.
  void send(bytes frame) {
    if (closed_) return;
    account(static_cast<std::ptrdiff_t>(frame.size()));
    outbox_.push_back(std::move(frame));
    if (!writing_ && !parsing_) write_next();
  }

  // On the strand. Warn-level reasons are the peer's fault.
  void close(const std::string& reason, bool warn) {
    if (closed_) return;
    closed_ = true;
    if (warn)
      TROUPE_LOG(log_level::warn, "store", core_->name, ": closing the connection from ", peer_,
                 ": ", reason);
    else
      TROUPE_LOG(log_level::debug, "store", core_->name, ": closing the connection from ", peer_,
                 ": ", reason);
    boost::system::error_code ec;
    if (parsing_ && !writing_) flush_queued();
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    outbox_.clear();  // the frames being written (in_flight_) live until their handler runs
    account(-static_cast<std::ptrdiff_t>(queued_));
    core_->forget_connection(this);
  }

  tcp::socket::executor_type executor() { return socket_.get_executor(); }

 private:
  // Reads whatever the peer has sent into in_ (after the bytes kept from the last read),
  // growing in_ only as far as the frame at its head needs.
  void read_more() {
    std::size_t kept = in_end_ - in_begin_;
    if (in_begin_ != 0) {
      if (kept != 0) std::memmove(in_.data(), in_.data() + in_begin_, kept);
      in_begin_ = 0;
      in_end_ = kept;
    }
    std::size_t want = read_chunk;
    if (kept >= wire::length_size) want = std::max(want, wire::length_size + frame_length());
    if (in_.size() < want) {
      in_.resize(want);
    } else if (kept == 0 && in_.size() > read_chunk) {
      bytes fresh(read_chunk);  // give back the room a large frame needed
      in_.swap(fresh);
    }
    socket_.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
                            [self = shared_from_this()](boost::system::error_code ec,
                                                        std::size_t n) { self->on_read(ec, n); });
  }

  // The length prefix of the frame at the head of in_; needs length_size bytes there.
  std::size_t frame_length() const {
    std::uint32_t n = 0;
    for (std::size_t i = 0; i < wire::length_size; ++i)
      n |= std::to_integer<std::uint32_t>(in_[in_begin_ + i]) << (8 * i);
    return n;
  }

  void on_read(boost::system::error_code ec, std::size_t got) {
    if (closed_) return;
    if (ec) {
      // A peer that stops within a length prefix ends the stream cleanly; within a body it
      // breaks a frame.
      bool mid_frame = in_end_ - in_begin_ >= wire::length_size;
      if (ec == asio::error::eof)
        return close(
            mid_frame ? "the peer closed it in the middle of a frame" : "the peer closed it",
            mid_frame);
      return close(ec.message(), mid_frame);
    }
    in_end_ += got;
    process_and_read();
  }

  // Answers the frames buffered in in_, then reads on, unless too many replies wait to be
  // sent: then the rest stays buffered and the write completion resumes here.
  void process_and_read() {
    // The replies to every frame of this read leave together, in one write.
    parsing_ = true;
    parse_frames();
    parsing_ = false;
    if (!closed_ && !writing_ && !outbox_.empty()) write_next();
    if (closed_ || closing_) return;
    if (over_limit()) {
      read_paused_ = true;
      return;
    }
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
    read_more();
  }

  bool over_limit() const { return queued_ > core_->options.max_queued_output; }

  // On the strand: keeps this connection's and the server's count of unsent reply bytes.
  void account(std::ptrdiff_t delta) {
    queued_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(queued_) + delta);
    if (delta >= 0)
      core_->queued_output.fetch_add(static_cast<std::size_t>(delta), std::memory_order_relaxed);
    else
      core_->queued_output.fetch_sub(static_cast<std::size_t>(-delta), std::memory_order_relaxed);
  }

  // Every complete frame in the buffer, in order; a partial one waits for the next read.
  void parse_frames() {
    while (!closed_ && !closing_ && !over_limit() && in_end_ - in_begin_ >= wire::length_size) {
      std::size_t n = frame_length();
      if (n > core_->options.max_frame_size)
        return close(
            strcat("frame of ", n, " bytes exceeds the limit of ", core_->options.max_frame_size,
                   " bytes (raise max_frame_size on server and clients if intended)"),
            true);
      if (n < wire::min_body)
        return close(
            strcat("frame of ", n, " bytes is shorter than the ", wire::min_body, "-byte minimum"),
            true);
      if (in_end_ - in_begin_ < wire::length_size + n) break;
      std::span<const std::byte> body(in_.data() + in_begin_ + wire::length_size, n);
      in_begin_ += wire::length_size + n;
      on_frame(body);
    }
  }

  // One complete frame body; it points into in_, which stays put until the next read.
  void on_frame(std::span<const std::byte> body) {
    if (!authenticated_) return on_hello(body);
    auto q = wire::decode_request(body);
    if (!q) return close(q.error().message(), true);
    handle(std::move(*q));
  }

  void on_hello(std::span<const std::byte> body) {
    auto h = wire::decode_hello(body);
    if (!h) return close(h.error().message(), true);
    if (h->version != wire::version) {
      refuse(make_error(errc::protocol_error, "this store server speaks protocol version ",
                        wire::version, " and the client speaks ", h->version,
                        "; use the same troupe version on both sides"));
      return;
    }
    if (!secrets_match(h->secret)) {
      refuse(make_error(errc::unauthorized, core_->name,
                        h->secret.empty() ? " requires a shared secret and the client sent none"
                                          : " refused the client's shared secret"));
      return;
    }
    authenticated_ = true;
    timer_.cancel();
    send(wire::encode_hello_ok(core_->name));
  }

  bool secrets_match(const std::string& given) const {
    const std::string& want = core_->options.secret;
    if (want.empty()) return true;
    // Compare every byte so the time taken does not reveal the matching prefix.
    unsigned char diff = given.size() == want.size() ? 0 : 1;
    for (std::size_t i = 0; i < want.size(); ++i)
      diff |= static_cast<unsigned char>(want[i] ^ (i < given.size() ? given[i] : 0));
    return diff == 0;
  }

  void refuse(const error& e) {
    TROUPE_LOG(log_level::warn, "store", core_->name, ": refusing ", peer_, ": ", e.message());
    closing_ = true;
    send(wire::encode_reply_error(0, e));
  }

  void reply_error(std::uint64_t id, const error& e) { send(wire::encode_reply_error(id, e)); }

  void handle(wire::request q) {
    auto& core = *core_;
    std::vector<delivery> ready;
    auto bad_key = [&](const std::string& k) {
      auto r = detail::check_key(k);
      if (!r) reply_error(q.id, r.error());
      return !r;
    };
    switch (q.op) {
      case wire::kind::set: {
        if (bad_key(q.key)) return;
        {
          std::lock_guard lk(core.mu);
          core.table.set(q.key, q.value);
          core.wake(q.key, ready);
        }
        send(wire::encode_reply_ok(q.id, [](byte_writer&) {}));
        break;
      }
      case wire::kind::get:
      case wire::kind::wait: {
        bool is_get = q.op == wire::kind::get;
        if (is_get) {
          if (bad_key(q.key)) return;
          q.keys.push_back(q.key);
        } else {
          for (const auto& k : q.keys)
            if (bad_key(k)) return;
        }
        auto w = std::make_shared<waiter>();
        w->conn = weak_from_this();
        w->owner = this;
        w->id = q.id;
        w->is_get = is_get;
        w->keys = std::move(q.keys);
        std::optional<bytes> value;
        bool parked = false;
        {
          std::lock_guard lk(core.mu);
          if (core.waiters.contains({this, q.id})) {
            closing_ = true;
          } else if (core.park(w)) {
            core.waiters.emplace(std::pair{this, q.id}, w);
            parked = true;
          } else if (is_get) {
            value = *core.table.find(w->keys.front());
          }
        }
        if (closing_) return close(strcat("request id ", q.id, " is already waiting"), true);
        if (parked) break;
        send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) {
          if (value) wr.blob(*value);
        }));
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
        send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) { wr.u8(all ? 1 : 0); }));
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
          reply_error(q.id, r.error());
        else
          send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) { wr.i64(*r); }));
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
        send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) { wr.blob(now); }));
        break;
      }
      case wire::kind::erase: {
        if (bad_key(q.key)) return;
        bool existed = false;
        {
          std::lock_guard lk(core.mu);
          existed = core.table.erase(q.key);
        }
        send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) { wr.u8(existed ? 1 : 0); }));
        break;
      }
      case wire::kind::num_keys: {
        std::int64_t n = 0;
        {
          std::lock_guard lk(core.mu);
          n = q.key.empty() ? core.table.size() : core.table.count_prefix(q.key);
        }
        send(wire::encode_reply_ok(q.id, [&](byte_writer& wr) { wr.i64(n); }));
        break;
      }
      case wire::kind::cancel:
        core.cancel(this, q.target);
        break;
      default:
        close(strcat("unexpected frame kind ", int(q.op)), true);
        return;
    }
    deliver(ready);
  }

  // Sends every queued frame with one gathered write; frames queued meanwhile go out
  // together when it completes.
  void write_next() {
    if (outbox_.empty() || closed_) {
      writing_ = false;
      if (closing_ && !closed_) close("refused at hello", false);
      return;
    }
    writing_ = true;
    in_flight_.clear();
    in_flight_.swap(outbox_);
    out_buffers_.clear();
    for (const auto& f : in_flight_) out_buffers_.push_back(asio::buffer(f));
    asio::async_write(socket_, out_buffers_,
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (self->closed_) return;
                        if (ec) return self->close(ec.message(), false);
                        std::size_t sent = 0;
                        for (const auto& f : self->in_flight_) sent += f.size();
                        self->account(-static_cast<std::ptrdiff_t>(sent));
                        self->writing_ = false;
                        if (self->read_paused_ && !self->over_limit()) {
                          self->read_paused_ = false;
                          self->process_and_read();  // may start the next write itself
                        }
                        if (!self->writing_) self->write_next();
                      });
  }

  // Closing while handling the frames of one read: the replies to the frames before the
  // offending one go out as far as the socket takes them without blocking, as they would
  // have had each frame been read and answered on its own.
  void flush_queued() {
    if (outbox_.empty()) return;
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    if (ec) return;
    out_buffers_.clear();
    for (const auto& f : outbox_) out_buffers_.push_back(asio::buffer(f));
    asio::write(socket_, out_buffers_, ec);
  }

  static constexpr std::size_t read_chunk = std::size_t{64} << 10;

  tcp::socket socket_;
  asio::steady_timer timer_;
  std::shared_ptr<shared_core> core_;
  std::string peer_;
  bytes in_;  // received bytes; [in_begin_, in_end_) not yet parsed
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  std::vector<bytes> outbox_;  // replies waiting for the write in flight
  std::vector<bytes> in_flight_;
  std::vector<asio::const_buffer> out_buffers_;
  std::size_t queued_ = 0;  // bytes in outbox_ and in_flight_
  bool read_paused_ = false;  // too many unsent replies: not reading until they drain
  bool writing_ = false;
  bool parsing_ = false;  // replies queue until the frames of one read are handled
  bool authenticated_ = false;
  bool closing_ = false;  // refuse the peer once the outbox is flushed
  bool closed_ = false;
};

void deliver(std::vector<delivery>& ready) {
  for (auto& d : ready) {
    auto conn = d.conn;
    asio::post(conn->executor(),
               [conn, frame = std::move(d.frame)]() mutable { conn->send(std::move(frame)); });
  }
}

}  // namespace

struct tcp_store_server::impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::shared_ptr<shared_core> core = std::make_shared<shared_core>();
  std::string host;
  std::uint16_t port = 0;
  std::thread thread;
  std::promise<void> exited;
  std::mutex shutdown_mu;
  bool stopped = false;

  void accept() {
    acceptor.async_accept(
        asio::make_strand(io), [this](boost::system::error_code ec, tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
          if (ec) {
            TROUPE_LOG(log_level::warn, "store", core->name, ": accept failed: ", ec.message());
          } else {
            boost::system::error_code nd;
            socket.set_option(tcp::no_delay(true), nd);
            auto c = std::make_shared<connection>(std::move(socket), core);
            {
              std::lock_guard lk(core->mu);
              core->connections.emplace(c.get(), c);
            }
            c->start();
          }
          accept();
        });
  }

  void run() {
    for (;;) {
      try {
        io.run();
        break;
      } catch (const std::exception& e) {
        TROUPE_LOG(log_level::error, "store", core->name, ": I/O thread caught: ", e.what());
      } catch (...) {
        TROUPE_LOG(log_level::error, "store", core->name, ": I/O thread caught an exception");
      }
    }
    exited.set_value();
  }
};

tcp_store_server::tcp_store_server(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

expected<std::unique_ptr<tcp_store_server>> tcp_store_server::start(
    tcp_store_server_options options) {
  if (options.host.empty())
    return make_error(errc::invalid_argument,
                      "tcp store server: the host to bind is empty; give an address such as "
                      "127.0.0.1 (or 0.0.0.0 to listen on every interface)");
  if (options.max_frame_size < 64)
    return make_error(errc::invalid_argument, "tcp store server: max_frame_size ",
                      options.max_frame_size, " is too small; use at least 64 bytes");
  auto i = std::make_unique<impl>();
  boost::system::error_code ec;
  tcp::endpoint ep;
  auto addr = asio::ip::make_address(options.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, options.port);
  } else {
    tcp::resolver resolver(i->io);
    auto results =
        resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::passive, ec);
    if (ec || results.empty())
      return make_error(errc::invalid_argument, "tcp store server: cannot resolve host '",
                        options.host, "': ", ec ? ec.message() : "no addresses");
    ep = results.begin()->endpoint();
  }
  auto fail = [&](std::string_view step) {
    return make_error(errc::unavailable, "tcp store server: cannot ", step, " ",
                      ep.address().to_string(), ":", options.port, ": ", ec.message(),
                      options.port != 0 ? "; pick another port or use port 0 for a free one" : "");
  };
  i->acceptor.open(ep.protocol(), ec);
  if (ec) return fail("open a socket for");
  i->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  i->acceptor.bind(ep, ec);
  if (ec) return fail("bind");
  i->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen on");
  auto local = i->acceptor.local_endpoint(ec);
  if (ec) return fail("read the bound address of");
  i->host = local.address().to_string();
  i->port = local.port();
  i->core->options = std::move(options);
  i->core->name = strcat("tcp store server ", i->host, ":", i->port);
  i->accept();
  auto* raw = i.get();
  i->thread = std::thread([raw] { raw->run(); });
  TROUPE_LOG(log_level::info, "store", raw->core->name, ": listening");
  return std::unique_ptr<tcp_store_server>(new tcp_store_server(std::move(i)));
}

tcp_store_server::~tcp_store_server() { shutdown(impl_->core->options.shutdown_timeout); }

const std::string& tcp_store_server::host() const noexcept { return impl_->host; }
std::uint16_t tcp_store_server::port() const noexcept { return impl_->port; }
std::string tcp_store_server::url() const {
  bool v6 = impl_->host.find(':') != std::string::npos;
  return strcat("tcp://", v6 ? "[" : "", impl_->host, v6 ? "]" : "", ":", impl_->port);
}

std::size_t tcp_store_server::num_connections() const {
  std::lock_guard lk(impl_->core->mu);
  return impl_->core->connections.size();
}

std::size_t tcp_store_server::queued_output_bytes() const {
  return impl_->core->queued_output.load(std::memory_order_relaxed);
}

void tcp_store_server::shutdown(duration timeout) {
  auto& i = *impl_;
  std::lock_guard lk(i.shutdown_mu);
  if (i.stopped) return;
  i.stopped = true;
  auto until = deadline::after(timeout);
  // Runs on the I/O thread, after any accept already in flight: nothing new registers.
  asio::post(i.io, [&i] {
    boost::system::error_code ec;
    i.acceptor.close(ec);
    std::vector<std::shared_ptr<connection>> open;
    {
      std::lock_guard clk(i.core->mu);
      for (auto& [p, weak] : i.core->connections)
        if (auto c = weak.lock()) open.push_back(std::move(c));
    }
    for (auto& c : open)
      asio::post(c->executor(), [c] { c->close("the server is shutting down", false); });
  });
  auto done = i.exited.get_future();
  if (done.wait_until(until.time_point()) != std::future_status::ready) {
    TROUPE_LOG(log_level::warn, "store", i.core->name, ": connections did not close within ",
               format_duration(timeout), "; stopping the I/O thread anyway");
    i.io.stop();
  }
  i.thread.join();
  TROUPE_LOG(log_level::info, "store", i.core->name, ": shut down");
}

}  // namespace troupe
