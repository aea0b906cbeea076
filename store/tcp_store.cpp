// The TCP store client: one connection, one I/O thread, one strand. Callers register a
// promise under a fresh request id, post the frame to the strand and wait on the future
// with their timeout; the read loop completes promises by id.
#include <utility>  // before Asio, for g++ 12

#include "store/tcp_store.hpp"

#include <unistd.h>
#include <array>
#include <boost/asio.hpp>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/future.hpp"
#include "core/log.hpp"
#include "store/detail/kv_table.hpp"
#include "store/detail/wire.hpp"

namespace troupe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace wire = detail::wire;

struct tcp_store::impl {
  tcp_store_options options;
  std::string name;
  asio::io_context io;
  asio::strand<asio::io_context::executor_type> strand{io.get_executor()};
  tcp::socket socket{strand};
  std::thread thread;

  std::mutex mu;  // guards pending, sticky, next_id
  std::unordered_map<std::uint64_t, promise<bytes>> pending;
  std::optional<error> sticky;
  std::uint64_t next_id = 1;

  // Only on the strand (or before the I/O thread starts).
  std::array<std::byte, wire::length_size> length{};
  bytes body;
  std::deque<bytes> outbox;
  bool writing = false;

  // ---- connecting: an asynchronous chain on the strand, awaited by the caller ----

  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::resolver::results_type endpoints;
  bytes hello;
  std::function<void(boost::system::error_code, std::string_view)> on_connected;

  // connect -> send the hello -> read the reply's length -> read the reply; ends in
  // on_connected(error, stage) exactly once.
  void connect_chain() {
    asio::async_connect(
        socket, endpoints, [this](boost::system::error_code ec, const tcp::endpoint&) {
          if (ec) return on_connected(ec, "connecting");
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          asio::async_write(
              socket, asio::buffer(hello), [this](boost::system::error_code e, std::size_t) {
                if (e) return on_connected(e, "sending the hello");
                asio::async_read(
                    socket, asio::buffer(length),
                    [this](boost::system::error_code e2, std::size_t) {
                      if (e2) return on_connected(e2, "reading the hello reply");
                      auto n = frame_length();
                      if (n < wire::min_body || n > options.max_frame_size)
                        return on_connected(asio::error::message_size, "reading the hello reply");
                      body.resize(n);
                      asio::async_read(socket, asio::buffer(body),
                                       [this](boost::system::error_code e3, std::size_t) {
                                         on_connected(e3, "reading the hello reply");
                                       });
                    });
              });
        });
  }

  // Closes the socket on the strand and waits until that has happened.
  void close_socket_and_wait() {
    std::promise<void> closed;
    asio::post(strand, [this, &closed] {
      boost::system::error_code ignored;
      socket.close(ignored);
      closed.set_value();
    });
    closed.get_future().wait();
  }

  expected<void> connect_once(const deadline& until) {
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    endpoints = resolver.resolve(options.host, std::to_string(options.port), ec);
    if (ec) return make_error(errc::connection_lost, "cannot resolve: ", ec.message());
    hello = wire::encode_hello(
        {wire::magic, wire::version, options.secret, strcat("tcp_store pid ", ::getpid())});
    std::mutex done_mu;
    std::condition_variable done_cv;
    bool done = false;
    boost::system::error_code result;
    std::string stage;
    on_connected = [&](boost::system::error_code e, std::string_view where) {
      std::lock_guard lk(done_mu);
      result = e;
      stage = std::string(where);
      done = true;
      done_cv.notify_all();
    };
    asio::post(strand, [this] { connect_chain(); });
    bool in_time = false;
    {
      std::unique_lock lk(done_mu);
      in_time = done_cv.wait_until(lk, until.time_point(), [&] { return done; });
    }
    if (!in_time) {
      // Cancel the chain and wait for its end: it refers to this frame's variables.
      close_socket_and_wait();
      std::unique_lock lk(done_mu);
      done_cv.wait(lk, [&] { return done; });
    }
    on_connected = nullptr;
    if (!in_time) return make_error(errc::timeout, stage, " took too long");
    if (result) {
      close_socket_and_wait();
      if (result == asio::error::message_size)
        return make_error(errc::protocol_error,
                          "the hello reply has an invalid length; is this port a troupe store "
                          "server?");
      return make_error(errc::connection_lost, stage, ": ", result.message());
    }
    auto r = check_hello_reply();
    if (!r) close_socket_and_wait();
    return r;
  }

  expected<void> check_hello_reply() {
    byte_reader r(body);
    auto k = r.u8("frame kind");
    TROUPE_TRY(r.u64("request id"));
    if (k && *k == static_cast<std::uint8_t>(wire::kind::hello_ok)) return ok();
    if (k && *k == static_cast<std::uint8_t>(wire::kind::reply)) {
      auto st = wire::decode_reply_status(r);
      if (!st && st.error().code() == errc::unauthorized)
        return make_error(errc::unauthorized, st.error().message(),
                          "; set the same secret on this client (tcp_store_options::secret or "
                          "TROUPE_STORE_SECRET) as on the server (--secret-file or "
                          "TROUPE_STORE_SECRET)");
      if (!st) return std::move(st).error();
    }
    return make_error(errc::protocol_error,
                      "the server's answer to the hello is not a troupe store reply; is this "
                      "port a troupe store server?");
  }

  std::uint32_t frame_length() const {
    std::uint32_t n = 0;
    for (std::size_t i = 0; i < wire::length_size; ++i)
      n |= std::to_integer<std::uint32_t>(length[i]) << (8 * i);
    return n;
  }

  // ---- running (on the strand) ----

  void read_length() {
    asio::async_read(
        socket, asio::buffer(length), [this](boost::system::error_code ec, std::size_t) {
          if (ec) return fail(lost(ec));
          auto n = frame_length();
          if (n < wire::min_body || n > options.max_frame_size)
            return fail(make_error(errc::protocol_error, name, " sent a frame of ", n,
                                   " bytes, outside the accepted 9..", options.max_frame_size));
          body.resize(n);
          asio::async_read(socket, asio::buffer(body),
                           [this](boost::system::error_code e, std::size_t) {
                             if (e) return fail(lost(e));
                             on_frame();
                           });
        });
  }

  void on_frame() {
    auto head = wire::peek(body);
    if (!head || head->first != wire::kind::reply)
      return fail(make_error(errc::protocol_error, name, " sent a frame that is not a reply"));
    std::optional<promise<bytes>> p;
    {
      std::lock_guard lk(mu);
      auto it = pending.find(head->second);
      if (it != pending.end()) {
        p.emplace(std::move(it->second));
        pending.erase(it);
      }
    }
    if (p) p->set_value(bytes(body.begin() + wire::min_body, body.end()));
    read_length();
  }

  error lost(boost::system::error_code ec) const {
    return make_error(errc::connection_lost, "lost the connection to ", name, " (",
                      ec == asio::error::eof ? std::string("the server closed it") : ec.message(),
                      "); the server may have exited or been shut down");
  }

  // Records the first error and fails everything pending with it.
  void fail(error e) {
    std::unordered_map<std::uint64_t, promise<bytes>> failed;
    {
      std::lock_guard lk(mu);
      if (!sticky) {
        if (e.code() != errc::shut_down) TROUPE_LOG(log_level::warn, "store", e.message());
        sticky = e;
      }
      failed.swap(pending);
    }
    for (auto& [id, p] : failed) p.set_error(*sticky);
    boost::system::error_code ec;
    socket.close(ec);
    // The frame being written stays alive until its handler runs; the rest can go.
    if (!writing) outbox.clear();
  }

  void send(bytes frame) {
    outbox.push_back(std::move(frame));
    if (!writing) write_next();
  }

  void write_next() {
    if (outbox.empty() || !socket.is_open()) {
      writing = false;
      outbox.clear();
      return;
    }
    writing = true;
    asio::async_write(socket, asio::buffer(outbox.front()),
                      [this](boost::system::error_code ec, std::size_t) {
                        if (ec) {
                          writing = false;
                          outbox.clear();
                          return fail(lost(ec));
                        }
                        outbox.pop_front();
                        write_next();
                      });
  }

  void run() {
    for (;;) {
      try {
        io.run();
        bool broken = false;
        {
          std::lock_guard lk(mu);
          broken = sticky.has_value();
        }
        TROUPE_LOG(log_level::debug, "store", name, ": I/O thread finished",
                   broken ? "" : " while the connection is open");
        return;
      } catch (const std::exception& e) {
        TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught: ", e.what());
      } catch (...) {
        TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught an exception");
      }
    }
  }

  // Fails everything with shut_down, lets the I/O thread run out of work and joins it.
  void stop() {
    asio::post(strand,
               [this] { fail(make_error(errc::shut_down, "this tcp_store client was closed")); });
    work.reset();
    if (thread.joinable()) thread.join();
  }

  // ---- calls (any thread) ----

  // Sends one request and waits for its reply payload (after the status byte).
  template <class Fill>
  expected<bytes> call(wire::kind k, Fill&& fill, duration timeout, std::string_view op,
                       const std::string& what, bool waits) {
    future<bytes> fut;
    std::uint64_t id = 0;
    {
      std::lock_guard lk(mu);
      if (sticky) return error(*sticky).with_operation(strcat("store.", op));
      id = next_id++;
      fut = pending[id].get_future();
    }
    wire::frame_builder fb(k, id);
    fill(fb.writer());
    bytes frame = std::move(fb).finish();
    if (frame.size() - wire::length_size > options.max_frame_size) {
      forget(id);
      return make_error(errc::invalid_argument, op, " of ", what, " on ", name, ": the request is ",
                        frame.size(), " bytes, over the frame limit of ", options.max_frame_size,
                        "; raise max_frame_size on server and clients or store less");
    }
    asio::post(strand, [this, f = std::move(frame)]() mutable { send(std::move(f)); });
    auto r = fut.get(timeout);
    if (fut.valid()) {  // still pending: our timeout, not the server's answer
      forget(id);
      if (waits) {
        wire::frame_builder c(wire::kind::cancel, 0);
        c.writer().u64(id);
        asio::post(strand, [this, f = std::move(c).finish()]() mutable {
          if (socket.is_open()) send(std::move(f));
        });
      }
      return detail::store_timeout(name, op, what, timeout);
    }
    if (!r) return std::move(r).error().with_operation(strcat("store.", op));
    byte_reader rd(*r);
    auto st = wire::decode_reply_status(rd);
    if (!st) return std::move(st).error().with_operation(strcat("store.", op));
    return bytes(r->end() - static_cast<std::ptrdiff_t>(rd.remaining()), r->end());
  }

  void forget(std::uint64_t id) {
    std::optional<promise<bytes>> p;
    std::lock_guard lk(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return;
    p.emplace(std::move(it->second));
    pending.erase(it);
  }
};

namespace {

template <class T>
expected<T> read_reply(expected<bytes>&& payload, std::string_view what,
                       expected<T> (byte_reader::*get)(std::string_view)) {
  if (!payload) return std::move(payload).error();
  byte_reader r(*payload);
  return (r.*get)(what);
}

}  // namespace

tcp_store::tcp_store(std::unique_ptr<impl> i) : impl_(std::move(i)) {
  set_timeout(impl_->options.timeout);
}

expected<std::unique_ptr<tcp_store>> tcp_store::connect(tcp_store_options options) {
  auto i = std::make_unique<impl>();
  i->options = std::move(options);
  i->name = strcat("tcp_store ", i->options.host, ":", i->options.port);
  auto until = deadline::after(i->options.connect_timeout);
  auto* io_owner = i.get();
  i->thread = std::thread([io_owner] { io_owner->run(); });
  duration backoff(10);
  error last;
  int attempts = 0;
  for (;;) {
    ++attempts;
    auto r = i->connect_once(until);
    if (r) break;
    last = std::move(r).error();
    if (last.code() == errc::unauthorized || last.code() == errc::protocol_error) {
      i->stop();
      return std::move(last).with_operation("store.connect");
    }
    TROUPE_LOG(log_level::debug, "store", i->name, ": connect attempt ", attempts,
               " failed: ", last.message());
    if (until.expired()) {
      i->stop();
      return make_error(errc::timeout, "could not connect to the tcp store server at ",
                        i->options.host, ":", i->options.port, " within ",
                        format_duration(i->options.connect_timeout), " (", attempts,
                        " attempts; last error: ", last.message(),
                        "); check that the server runs there (troupe-store --host ... --port "
                        "...) and is reachable")
          .with_operation("store.connect");
    }
    std::this_thread::sleep_for(std::min(backoff, until.remaining()));  // retry back-off
    backoff = std::min(backoff * 2, duration(500));
  }
  auto* raw = i.get();
  asio::post(raw->strand, [raw] { raw->read_length(); });
  return std::unique_ptr<tcp_store>(new tcp_store(std::move(i)));
}

tcp_store::~tcp_store() { impl_->stop(); }

std::string tcp_store::describe() const { return impl_->name; }

std::optional<error> tcp_store::connection_error() const {
  std::lock_guard lk(impl_->mu);
  return impl_->sticky;
}

expected<void> tcp_store::set(std::string_view key, std::span<const std::byte> value,
                              duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::set,
      [&](byte_writer& w) {
        w.str(key);
        w.blob(value);
      },
      timeout, "set", strcat("key '", key, "'"), false);
  if (!r) return std::move(r).error();
  return ok();
}

expected<bytes> tcp_store::get(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::get, [&](byte_writer& w) { w.str(key); }, timeout, "get",
      strcat("key '", key, "'"), true);
  if (!r) return std::move(r).error();
  byte_reader rd(*r);
  return rd.blob("value");
}

expected<bool> tcp_store::check(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  auto r = impl_->call(
      wire::kind::check,
      [&](byte_writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.str(k);
      },
      timeout, "check", "keys " + detail::quote_keys(keys), false);
  auto v = read_reply<std::uint8_t>(std::move(r), "check result", &byte_reader::u8);
  if (!v) return std::move(v).error();
  return *v != 0;
}

expected<std::int64_t> tcp_store::add(std::string_view key, std::int64_t delta, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::add,
      [&](byte_writer& w) {
        w.str(key);
        w.i64(delta);
      },
      timeout, "add", strcat("key '", key, "'"), false);
  return read_reply<std::int64_t>(std::move(r), "add result", &byte_reader::i64);
}

expected<bytes> tcp_store::compare_set(std::string_view key,
                                       const std::optional<bytes>& expected_value,
                                       std::span<const std::byte> desired, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::compare_set,
      [&](byte_writer& w) {
        w.str(key);
        w.u8(expected_value ? 1 : 0);
        if (expected_value) w.blob(*expected_value);
        w.blob(desired);
      },
      timeout, "compare_set", strcat("key '", key, "'"), false);
  if (!r) return std::move(r).error();
  byte_reader rd(*r);
  return rd.blob("compare_set result");
}

expected<bool> tcp_store::erase(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::erase, [&](byte_writer& w) { w.str(key); }, timeout, "erase",
      strcat("key '", key, "'"), false);
  auto v = read_reply<std::uint8_t>(std::move(r), "erase result", &byte_reader::u8);
  if (!v) return std::move(v).error();
  return *v != 0;
}

expected<void> tcp_store::wait(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  if (keys.empty()) return ok();
  auto r = impl_->call(
      wire::kind::wait,
      [&](byte_writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.str(k);
      },
      timeout, "wait", "keys " + detail::quote_keys(keys), true);
  if (!r) {
    // Name only the keys still missing, when the store can still tell.
    if (r.error().code() == errc::timeout) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        std::array<std::string, 1> one{k};
        auto present = check(one, std::chrono::seconds(1));
        if (!present) return std::move(r).error();
        if (!*present) missing.push_back(k);
      }
      if (!missing.empty())
        return detail::store_timeout(impl_->name, "wait", "keys " + detail::quote_keys(missing),
                                     timeout);
    }
    return std::move(r).error();
  }
  return ok();
}

expected<std::int64_t> tcp_store::num_keys(duration timeout) {
  return num_keys_with_prefix("", timeout);
}

expected<std::int64_t> tcp_store::num_keys_with_prefix(std::string_view prefix, duration timeout) {
  auto r = impl_->call(
      wire::kind::num_keys, [&](byte_writer& w) { w.str(prefix); }, timeout, "num_keys",
      "the key count", false);
  return read_reply<std::int64_t>(std::move(r), "key count", &byte_reader::i64);
}

}  // namespace troupe
