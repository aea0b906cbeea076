// Why this file is long (~900 lines): the connect chain (with its TLS handshake), the
// caller-as-reader protocol and every store operation share one connection and its lock;
// split, each part would need the others' private state.
// The TCP store client: one connection. Connecting (connect, hello) runs as an Asio chain
// on a short-lived I/O thread; after that, callers do their own I/O: each writes its
// request frame and waits for the reply under its request id, one waiting caller at a
// time acting as the reader (see "running" below). No thread handoff on the fast path.
#include <utility>  // before Asio, for g++ 12

#include <troupe/store/tcp_store.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <troupe/core/hmac.hpp>
#include <troupe/core/log.hpp>
#include <troupe/store/detail/kv_table.hpp>
#include <troupe/store/detail/wire.hpp>
#include <troupe/store/tcp_store_server.hpp>  // local_socket_name

namespace troupe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace wire = detail::wire;

struct tcp_store::impl {
  tcp_store_options options;
  std::string name;
  asio::io_context io;
  asio::strand<asio::io_context::executor_type> strand{io.get_executor()};
  // TCP, or the server's local socket when it listens on one (tcp_store_server.hpp).
  asio::generic::stream_protocol::socket socket{strand};
  bool local = false;  // connected through the local socket; set before the chain ends
  std::thread thread;

  std::mutex mu;  // guards waiting, reading, sticky, next_id
  std::optional<error> sticky;
  std::uint64_t next_id = 1;

  // Only on the strand (or before the I/O thread starts).
  std::array<std::byte, wire::length_size> length{};
  bytes body;

  // TLS (options.tls set): the context, and the session of a TCP connection (null on the
  // local socket). While connecting only the strand touches the session; afterwards every
  // call on it holds tls_mu.
  std::shared_ptr<const tls::context> tls_ctx;
  std::unique_ptr<tls::session> tls;
  std::mutex tls_mu;
  bytes cbuf;             // ciphertext received: the strand's while connecting, then the reader's
  bytes pbuf;             // connecting: plaintext decrypted and not yet consumed
  bytes sealed;           // connecting: ciphertext to send
  bool answered = false;  // connecting: the server has sent something during the handshake

  // ---- connecting: an asynchronous chain on the strand, awaited by the caller ----

  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::vector<asio::generic::stream_protocol::endpoint> endpoints;
  std::string local_name;  // the server's local socket to try first; empty: TCP only
  bytes hello;
  std::string client_nonce;
  bytes answer;                          // the auth frame, once challenged
  std::optional<error> handshake_error;  // the server failed its proof
  std::function<void(boost::system::error_code, std::string_view)> on_connected;

  // connect -> send the hello -> read the reply's length -> read the reply; ends in
  // on_connected(error, stage) exactly once.
  // The local socket first when there may be one: a server without it refuses at once
  // (no such name), and TCP follows.
  void connect_chain() {
    if (local_name.empty()) return connect_tcp();
    socket.async_connect(asio::local::stream_protocol::endpoint(local_name),
                         [this](boost::system::error_code ec) {
                           if (!ec) {
                             local = true;
                             return send_hello();
                           }
                           boost::system::error_code ignored;
                           socket.close(ignored);
                           connect_tcp();
                         });
  }

  void connect_tcp() {
    asio::async_connect(
        socket, endpoints,
        [this](boost::system::error_code ec, const asio::generic::stream_protocol::endpoint&) {
          if (ec) return on_connected(ec, "connecting");
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          if (tls_ctx) return start_tls();
          send_hello();
        });
  }

  // ---- TLS while connecting: the handshake, then the hello's frames encrypted ----

  static boost::system::error_code tls_failed() {
    return boost::system::error_code(asio::error::access_denied);
  }

  // An error of the TLS layer, naming the server.
  error tls_error(const error& e) const {
    return make_error(e.code(), "TLS with the tcp store server at ", options.host, ":",
                      options.port, ": ", e.message());
  }

  void start_tls() {
    auto s = tls::session::make(tls_ctx, true);
    if (!s) {
      handshake_error = std::move(s).error();
      return on_connected({}, "");
    }
    tls = std::move(*s);
    answered = false;
    tls_step();
  }

  // Advances the handshake: sends what the session made, then reads the server's next
  // flight, until the handshake is complete; then the hello, inside TLS.
  void tls_step() {
    auto h = tls->handshake();
    if (!h) {
      handshake_error = tls_error(h.error());
      return on_connected({}, "");
    }
    sealed.clear();
    tls->take_output(sealed);
    auto next = [this, done = *h] {
      if (done) return send_hello();
      cbuf.resize(std::size_t{16} << 10);
      socket.async_read_some(
          asio::buffer(cbuf), [this](boost::system::error_code e, std::size_t got) {
            if (e) return on_connected(e, "the TLS handshake");
            std::span<const std::byte> in(cbuf.data(), got);
            if (!std::exchange(answered, true) && plain_answer(in)) {
              handshake_error = make_error(
                  errc::unauthorized, "the tcp store server at ", options.host, ":", options.port,
                  " answered without TLS: it does not use TLS and this client does; set "
                  "TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA on both sides (the store "
                  "server and every client), or on neither");
              return on_connected({}, "");
            }
            tls->put_input(in);
            tls_step();
          });
    };
    if (sealed.empty()) return next();
    asio::async_write(socket, asio::buffer(sealed),
                      [this, next](boost::system::error_code e, std::size_t) {
                        if (e) return on_connected(e, "the TLS handshake");
                        next();
                      });
  }

  // Whether the first bytes of the server's answer are a plain store reply (a length of
  // less than 64 KiB, then the reply kind) rather than a TLS record (whose third byte, the
  // minor version, is never 0).
  static bool plain_answer(std::span<const std::byte> in) {
    return in.size() > wire::length_size && in[2] == std::byte{0} && in[3] == std::byte{0} &&
           in[wire::length_size] == std::byte{static_cast<std::uint8_t>(wire::kind::reply)};
  }

  // Decrypts what the session holds onto the end of `out`. Callers serialize (strand or
  // tls_mu).
  expected<void> decrypt(bytes& out, std::size_t& end) {
    for (;;) {
      if (out.size() - end < (std::size_t{16} << 10)) out.resize(end + (std::size_t{64} << 10));
      auto n = tls->read(std::span<std::byte>(out.data() + end, out.size() - end));
      if (!n) return std::move(n).error();
      if (*n == 0) return ok();
      end += *n;
    }
  }

  // Writes a handshake message: as is, or encrypted on a TLS connection.
  template <class Then>
  void write_handshake(const bytes& plain, Then then) {
    if (!tls)
      return asio::async_write(socket, asio::buffer(plain),
                               [then](boost::system::error_code e, std::size_t) { then(e); });
    if (auto w = tls->write(plain); !w) {
      handshake_error = tls_error(w.error());
      return then(tls_failed());
    }
    sealed.clear();
    tls->take_output(sealed);
    asio::async_write(socket, asio::buffer(sealed),
                      [then](boost::system::error_code e, std::size_t) { then(e); });
  }

  // Reads exactly to.size() bytes of handshake: from the socket, or decrypted.
  template <class Then>
  void read_exact(asio::mutable_buffer to, Then then) {
    if (!tls)
      return asio::async_read(socket, to,
                              [then](boost::system::error_code e, std::size_t) { then(e); });
    if (pbuf.size() >= to.size()) {
      std::memcpy(to.data(), pbuf.data(), to.size());
      pbuf.erase(pbuf.begin(), pbuf.begin() + static_cast<std::ptrdiff_t>(to.size()));
      return then(boost::system::error_code());
    }
    cbuf.resize(std::size_t{16} << 10);
    socket.async_read_some(asio::buffer(cbuf),
                           [this, to, then](boost::system::error_code e, std::size_t got) {
                             if (e) return then(e);
                             tls->put_input(std::span<const std::byte>(cbuf.data(), got));
                             std::size_t end = pbuf.size();
                             auto r = decrypt(pbuf, end);
                             pbuf.resize(end);
                             if (!r) {
                               handshake_error = tls_error(r.error());
                               return then(tls_failed());
                             }
                             read_exact(to, then);
                           });
  }

  void send_hello() {
    write_handshake(hello, [this](boost::system::error_code e) {
      if (e) return on_connected(e, "sending the hello");
      read_handshake_frame([this](boost::system::error_code e2) {
        if (e2) return on_connected(e2, "reading the hello reply");
        if (body.size() < 1 ||
            body[0] != std::byte{static_cast<std::uint8_t>(wire::kind::challenge)})
          return on_connected({}, "");  // hello_ok, or a refusal that the caller reads
        if (!answer_challenge()) return on_connected({}, "");
        write_handshake(answer, [this](boost::system::error_code e3) {
          if (e3) return on_connected(e3, "answering the challenge");
          read_handshake_frame([this](boost::system::error_code e4) {
            on_connected(e4, "reading the answer to the challenge");
          });
        });
      });
    });
  }

  // Reads one frame into `body`; message_size for a length no handshake frame has.
  template <class Then>
  void read_handshake_frame(Then then) {
    read_exact(asio::buffer(length), [this, then](boost::system::error_code e) {
      if (e) return then(e);
      auto n = frame_length();
      if (n < wire::min_body || n > options.max_frame_size)
        return then(boost::system::error_code(asio::error::message_size));
      body.resize(n);
      read_exact(asio::buffer(body), [then](boost::system::error_code e2) { then(e2); });
    });
  }

  // The server has a secret: check its proof (it must know ours) and prove ours. False,
  // with handshake_error set, when the server's proof is wrong.
  bool answer_challenge() {
    auto c = wire::decode_challenge(body);
    if (!c) {
      handshake_error = std::move(c).error();
      return false;
    }
    wire::auth a;
    if (!options.secret.empty()) {
      auto want = wire::handshake_proof("server", options.secret, client_nonce, c->nonce);
      if (!equal_constant_time(std::as_bytes(std::span(want.data(), want.size())),
                               std::as_bytes(std::span(c->proof.data(), c->proof.size())))) {
        handshake_error =
            make_error(errc::unauthorized,
                       "the store server does not know this client's secret (another "
                       "job's store, or a different secret); set the same secret on both sides "
                       "(TROUPE_JOB_SECRET, --secret-file)");
        return false;
      }
      a.has_secret = true;
      a.proof = wire::handshake_proof("client", options.secret, client_nonce, c->nonce);
    }
    answer = wire::encode_auth(a);
    return true;
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
    auto resolved = resolver.resolve(options.host, std::to_string(options.port), ec);
    if (ec) return make_error(errc::connection_lost, "cannot resolve: ", ec.message());
    endpoints.clear();
    for (const auto& e : resolved) endpoints.emplace_back(e.endpoint());
    local = false;
    local_name.clear();
    tls.reset();
    pbuf.clear();
    if (options.local_socket && !resolved.empty()) {
      auto first = resolved.begin()->endpoint().address();
      if (first.is_loopback()) local_name = local_socket_name(first.to_string(), options.port);
    }
    auto nonce = make_nonce();
    if (!nonce) return std::move(nonce).error();
    client_nonce.assign(reinterpret_cast<const char*>(nonce->data()), nonce->size());
    handshake_error.reset();
    answer.clear();
    hello = wire::encode_hello(
        {wire::magic, wire::version, client_nonce, strcat("tcp_store pid ", ::getpid())});
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
    if (handshake_error) {
      close_socket_and_wait();
      return *handshake_error;
    }
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
    if (k && *k == static_cast<std::uint8_t>(wire::kind::hello_ok)) {
      // A server that asked for no proof is not the job's when this client has a secret.
      if (!options.secret.empty() && answer.empty())
        return make_error(errc::unauthorized,
                          "the store server requires no secret but this client has one "
                          "(TROUPE_JOB_SECRET or tcp_store_options::secret): it is not this "
                          "job's store, or it was started without the job's secret "
                          "(troupe-store --secret-file, troupe-run --secret-file)");
      return ok();
    }
    if (k && *k == static_cast<std::uint8_t>(wire::kind::reply)) {
      auto st = wire::decode_reply_status(r);
      // A refusal for want of TLS says itself what to set.
      if (!st && st.error().code() == errc::unauthorized &&
          st.error().message().find("TROUPE_TLS_CERT") != std::string::npos)
        return make_error(errc::unauthorized, "refused by the tcp store server at ", options.host,
                          ":", options.port, ": ", st.error().message());
      if (!st && st.error().code() == errc::unauthorized)
        return make_error(errc::unauthorized, st.error().message(),
                          "; set the same secret on this client (tcp_store_options::secret or "
                          "TROUPE_JOB_SECRET) as on the server (--secret-file or "
                          "TROUPE_JOB_SECRET)");
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

  // ---- running: callers do their own I/O (no I/O thread once connected) ----
  //
  // A caller writes its request under write_mu, then waits for its reply. Whichever
  // waiting caller finds no reader becomes the reader: it polls the socket with its own
  // deadline, reads what is there, hands every complete reply to its caller's slot and
  // gives the role up again. A lone caller thus reads its own reply with no thread
  // switch; concurrent callers cost one wake-up each.

  struct slot {
    bool done = false;
    bytes reply;  // the reply body after kind and request id
  };

  std::mutex write_mu;         // serializes whole frames on the socket
  bytes wsealed;               // TLS: the frame being sent, encrypted; under write_mu
  std::condition_variable cv;  // slot filled, reader role released, or failure
  std::unordered_map<std::uint64_t, slot*> waiting;  // guarded by mu
  bool reading = false;    // guarded by mu: a caller holds the reader role
  bytes rbuf;              // only touched by the reader
  std::size_t rstart = 0;  // first unparsed byte of rbuf
  std::size_t rend = 0;    // end of the bytes received into rbuf

  int fd() { return socket.native_handle(); }

  error lost(std::string_view why) const {
    return make_error(errc::connection_lost, "lost the connection to ", name, " (", why,
                      "); the server may have exited or been shut down");
  }

  // Records the first error, fails every waiting call with it and wakes everyone.
  void fail(error e) {
    {
      std::lock_guard lk(mu);
      if (!sticky) {
        if (e.code() != errc::shut_down) TROUPE_LOG(log_level::warn, "store", e.message());
        sticky = std::move(e);
      }
    }
    ::shutdown(fd(), SHUT_RDWR);  // wakes a reader blocked in poll()
    cv.notify_all();
  }

  // Writes a whole frame before the deadline; a failure breaks the connection, since a
  // half-written frame leaves the stream unusable.
  expected<void> write_frame(std::span<const std::byte> frame, const deadline& until) {
    std::lock_guard wl(write_mu);
    if (!tls) return send_all(frame, until, false);
    {
      std::lock_guard tl(tls_mu);
      if (auto w = tls->write(frame); !w) {
        auto e = make_error(errc::connection_lost, name, ": TLS: ", w.error().message());
        fail(e);
        return e;
      }
      wsealed.clear();
      tls->take_output(wsealed);
    }
    return send_all(wsealed, until, true);
  }

  // Sends all of `data` before the deadline; write_mu held. `sealed`: TLS records, which
  // cannot be dropped once made, so that any of them unsent breaks the connection.
  expected<void> send_all(std::span<const std::byte> frame, const deadline& until, bool sealed) {
    std::size_t off = 0;
    while (off < frame.size()) {
      ssize_t n = ::send(fd(), frame.data() + off, frame.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd(), POLLOUT, 0};
        int ms = static_cast<int>(std::min<long long>(until.remaining().count(), 1 << 30));
        if (ms == 0) {
          auto e = make_error(errc::timeout, "the server did not accept the request in time");
          if (off > 0 || sealed)
            fail(lost(sealed ? "a request was encrypted and not sent before its deadline"
                             : "a request was only partly sent before its deadline"));
          return e;
        }
        ::poll(&p, 1, ms);
        continue;
      }
      auto e = lost(n == 0 ? "the socket accepted nothing" : std::strerror(errno));
      fail(e);
      return e;
    }
    return ok();
  }

  // One round of the reader role: waits for data until `until` (or one receive-timeout
  // slice), reads what is there and delivers every complete reply. Called without mu
  // held. The socket is blocking with SO_RCVTIMEO, so a round costs one recv() when data
  // comes, instead of poll() + recv().
  void read_round(const deadline& until) {
    set_receive_slice(until.remaining());
    if (rstart > 0 && rbuf.size() - rend < 65536) {  // make room without zero-filling
      std::copy(rbuf.begin() + static_cast<std::ptrdiff_t>(rstart),
                rbuf.begin() + static_cast<std::ptrdiff_t>(rend), rbuf.begin());
      rend -= rstart;
      rstart = 0;
    }
    if (tls) return read_round_tls();
    if (rbuf.size() - rend < 65536) rbuf.resize(rend + 65536);
    ssize_t n = ::recv(fd(), rbuf.data() + rend, rbuf.size() - rend, 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      return fail(lost(n == 0 ? std::string("the server closed it") : std::strerror(errno)));
    }
    rend += static_cast<std::size_t>(n);
    deliver_frames();
  }

  // The reader's round on a TLS connection: ciphertext into cbuf, plaintext after rend.
  void read_round_tls() {
    if (cbuf.size() < 65536) cbuf.resize(65536);
    ssize_t n = ::recv(fd(), cbuf.data(), cbuf.size(), 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      return fail(lost(n == 0 ? std::string("the server closed it") : std::strerror(errno)));
    }
    expected<void> r;
    bool to_send = false;
    {
      std::lock_guard tl(tls_mu);
      tls->put_input(std::span<const std::byte>(cbuf.data(), static_cast<std::size_t>(n)));
      r = decrypt(rbuf, rend);
      to_send = tls->output_size() > 0;
    }
    if (!r) {
      if (r.error().code() == errc::connection_lost)
        return fail(lost("the server closed its TLS session"));
      return fail(make_error(r.error().code(), name, ": TLS: ", r.error().message()));
    }
    if (to_send) send_tls_output();
    deliver_frames();
  }

  // What the session made while decrypting (none with the records this server sends, but
  // TLS allows it), sent in order with the requests.
  void send_tls_output() {
    std::lock_guard wl(write_mu);
    {
      std::lock_guard tl(tls_mu);
      wsealed.clear();
      tls->take_output(wsealed);
    }
    if (!wsealed.empty()) (void)send_all(wsealed, deadline::after(std::chrono::seconds(1)), true);
  }

  // A blocked recv() returns after at most this long, so the reader re-checks its
  // deadline; shortened (one setsockopt) only for a deadline closer than that.
  static constexpr duration receive_slice{100};
  duration current_slice{0};

  void set_receive_slice(duration remaining) {
    duration want = std::clamp(remaining, duration(1), receive_slice);
    if (want == current_slice) return;
    if (want < receive_slice || current_slice != receive_slice) {
      timeval tv{};
      tv.tv_sec = static_cast<time_t>(want.count() / 1000);
      tv.tv_usec = static_cast<suseconds_t>((want.count() % 1000) * 1000);
      ::setsockopt(fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      current_slice = want;
    }
  }

  void deliver_frames() {
    std::vector<std::pair<std::uint64_t, bytes>> replies;
    while (rend - rstart >= wire::length_size) {
      std::uint32_t len = 0;
      for (std::size_t i = 0; i < wire::length_size; ++i)
        len |= std::to_integer<std::uint32_t>(rbuf[rstart + i]) << (8 * i);
      if (len < wire::min_body || len > options.max_frame_size)
        return fail(make_error(errc::protocol_error, name, " sent a frame of ", len,
                               " bytes, outside the accepted ", wire::min_body, "..",
                               options.max_frame_size));
      if (rend - rstart - wire::length_size < len) break;  // partial frame
      std::span<const std::byte> body(rbuf.data() + rstart + wire::length_size, len);
      auto head = wire::peek(body);
      if (!head || head->first != wire::kind::reply)
        return fail(make_error(errc::protocol_error, name, " sent a frame that is not a reply"));
      replies.emplace_back(head->second, bytes(body.begin() + wire::min_body, body.end()));
      rstart += wire::length_size + len;
    }
    if (rstart == rend) rstart = rend = 0;
    if (replies.empty()) return;
    {
      std::lock_guard lk(mu);
      for (auto& [id, payload] : replies) {
        auto it = waiting.find(id);
        if (it == waiting.end()) continue;  // its caller gave up (timeout): drop the reply
        it->second->reply = std::move(payload);
        it->second->done = true;
        waiting.erase(it);
      }
    }
    cv.notify_all();
  }

  // Ends the connection: fails all calls with shut_down, waits for the reader to leave.
  void stop() {
    if (thread.joinable()) {  // still connecting: the Asio chain owns the socket
      asio::post(strand, [this] {
        boost::system::error_code ignored;
        socket.close(ignored);
      });
      work.reset();
      thread.join();
      return;
    }
    fail(make_error(errc::shut_down, "this tcp_store client was closed"));
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return !reading; });
  }

  // The I/O thread runs only while connecting (the connect and hello chain).
  void run() {
    try {
      io.run();
    } catch (const std::exception& e) {
      TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught: ", e.what());
    } catch (...) {
      TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught an exception");
    }
  }

  // Lets the I/O thread finish once the connect chain is done; from here on callers
  // use the socket directly.
  void finish_connecting() {
    work.reset();
    thread.join();
    // Replies decrypted with the last handshake frame (none are sent before it is
    // answered, but nothing is lost if one were).
    rbuf = std::move(pbuf);
    rstart = 0;
    rend = rbuf.size();
    // From here on only plain blocking calls with explicit timeouts touch the socket.
    int flags = ::fcntl(fd(), F_GETFL, 0);
    if (flags >= 0) ::fcntl(fd(), F_SETFL, flags & ~O_NONBLOCK);
    set_receive_slice(receive_slice);
  }

  // ---- calls (any thread) ----

  // Sends one request and waits for its reply payload (after the status byte). `what()`
  // names the request's keys for error messages; it runs only when there is an error.
  template <class Fill, class What>
  expected<bytes> call(wire::kind k, std::size_t payload_hint, Fill&& fill, duration timeout,
                       std::string_view op, What&& what, bool waits) {
    auto until = deadline::after(timeout);
    slot mine;
    std::uint64_t id = 0;
    {
      std::lock_guard lk(mu);
      if (sticky) return error(*sticky).with_operation(strcat("store.", op));
      id = next_id++;
      waiting.emplace(id, &mine);
    }
    wire::frame_builder fb(k, id, payload_hint);
    fill(fb.writer());
    bytes frame = std::move(fb).finish();
    if (frame.size() - wire::length_size > options.max_frame_size) {
      forget(id);
      return make_error(errc::invalid_argument, op, " of ", what(), " on ", name,
                        ": the request is ", frame.size(), " bytes, over the frame limit of ",
                        options.max_frame_size,
                        "; raise max_frame_size on server and clients or store less");
    }
    if (auto w = write_frame(frame, until); !w) {
      forget(id);
      if (w.error().code() == errc::timeout)
        return detail::store_timeout(name, op, what(), timeout);
      return std::move(w).error().with_operation(strcat("store.", op));
    }
    std::unique_lock lk(mu);
    while (!mine.done && !sticky && !until.expired()) {
      if (!reading) {
        reading = true;
        lk.unlock();
        read_round(until);
        lk.lock();
        reading = false;
        cv.notify_all();  // another waiter may take the reader role
      } else {
        cv.wait_until(lk, until.time_point());
      }
    }
    if (!mine.done) {
      waiting.erase(id);
      if (sticky) return error(*sticky).with_operation(strcat("store.", op));
      lk.unlock();
      if (waits) {  // tell the server to forget the waiter
        wire::frame_builder c(wire::kind::cancel, 0);
        c.writer().u64(id);
        (void)write_frame(std::move(c).finish(), deadline::after(std::chrono::seconds(1)));
      }
      return detail::store_timeout(name, op, what(), timeout);
    }
    lk.unlock();
    byte_reader rd(mine.reply);
    auto st = wire::decode_reply_status(rd);
    if (!st) return std::move(st).error().with_operation(strcat("store.", op));
    return bytes(mine.reply.end() - static_cast<std::ptrdiff_t>(rd.remaining()), mine.reply.end());
  }

  // Writes one request that gets no reply (request id 0).
  template <class Fill, class What>
  expected<void> send_only(wire::kind k, std::size_t payload_hint, Fill&& fill, duration timeout,
                           std::string_view op, What&& what) {
    auto until = deadline::after(timeout);
    {
      std::lock_guard lk(mu);
      if (sticky) return error(*sticky).with_operation(strcat("store.", op));
    }
    wire::frame_builder fb(k, 0, payload_hint);
    fill(fb.writer());
    bytes frame = std::move(fb).finish();
    if (frame.size() - wire::length_size > options.max_frame_size)
      return make_error(errc::invalid_argument, op, " of ", what(), " on ", name,
                        ": the request is ", frame.size(), " bytes, over the frame limit of ",
                        options.max_frame_size,
                        "; raise max_frame_size on server and clients or store less");
    if (auto w = write_frame(frame, until); !w) {
      if (w.error().code() == errc::timeout)
        return detail::store_timeout(name, op, what(), timeout);
      return std::move(w).error().with_operation(strcat("store.", op));
    }
    return ok();
  }

  void forget(std::uint64_t id) {
    std::lock_guard lk(mu);
    waiting.erase(id);
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
  if (i->options.tls.enabled()) {
    auto ctx = tls::context::make(i->options.tls);
    if (!ctx)
      return make_error(ctx.error().code(), i->name, ": ", ctx.error().message())
          .with_operation("store.connect");
    i->tls_ctx = std::move(*ctx);
  }
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
  i->finish_connecting();
  return std::unique_ptr<tcp_store>(new tcp_store(std::move(i)));
}

tcp_store::~tcp_store() { impl_->stop(); }

std::string tcp_store::describe() const { return impl_->name; }

bool tcp_store::connected_locally() const noexcept { return impl_->local; }

bool tcp_store::uses_tls() const noexcept { return impl_->tls != nullptr; }

std::optional<error> tcp_store::connection_error() const {
  std::lock_guard lk(impl_->mu);
  return impl_->sticky;
}

expected<void> tcp_store::set(std::string_view key, std::span<const std::byte> value,
                              duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::set, key.size() + value.size() + 8,
      [&](byte_writer& w) {
        w.str(key);
        w.blob(value);
      },
      timeout, "set", [&] { return strcat("key '", key, "'"); }, false);
  if (!r) return std::move(r).error();
  return ok();
}

expected<void> tcp_store::set_nowait(std::string_view key, std::span<const std::byte> value,
                                     duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  return impl_->send_only(
      wire::kind::set_quiet, key.size() + value.size() + 8,
      [&](byte_writer& w) {
        w.str(key);
        w.blob(value);
      },
      timeout, "set_nowait", [&] { return strcat("key '", key, "'"); });
}

expected<bytes> tcp_store::get(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::get, key.size() + 4, [&](byte_writer& w) { w.str(key); }, timeout, "get",
      [&] { return strcat("key '", key, "'"); }, true);
  if (!r) return std::move(r).error();
  byte_reader rd(*r);
  return rd.blob("value");
}

expected<bool> tcp_store::check(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  auto r = impl_->call(
      wire::kind::check, 0,
      [&](byte_writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.str(k);
      },
      timeout, "check", [&] { return "keys " + detail::quote_keys(keys); }, false);
  auto v = read_reply<std::uint8_t>(std::move(r), "check result", &byte_reader::u8);
  if (!v) return std::move(v).error();
  return *v != 0;
}

expected<std::int64_t> tcp_store::add(std::string_view key, std::int64_t delta, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::add, key.size() + 12,
      [&](byte_writer& w) {
        w.str(key);
        w.i64(delta);
      },
      timeout, "add", [&] { return strcat("key '", key, "'"); }, false);
  return read_reply<std::int64_t>(std::move(r), "add result", &byte_reader::i64);
}

expected<bytes> tcp_store::compare_set(std::string_view key,
                                       const std::optional<bytes>& expected_value,
                                       std::span<const std::byte> desired, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::compare_set,
      key.size() + desired.size() + (expected_value ? expected_value->size() : 0) + 16,
      [&](byte_writer& w) {
        w.str(key);
        w.u8(expected_value ? 1 : 0);
        if (expected_value) w.blob(*expected_value);
        w.blob(desired);
      },
      timeout, "compare_set", [&] { return strcat("key '", key, "'"); }, false);
  if (!r) return std::move(r).error();
  byte_reader rd(*r);
  return rd.blob("compare_set result");
}

expected<bool> tcp_store::erase(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto r = impl_->call(
      wire::kind::erase, key.size() + 4, [&](byte_writer& w) { w.str(key); }, timeout, "erase",
      [&] { return strcat("key '", key, "'"); }, false);
  auto v = read_reply<std::uint8_t>(std::move(r), "erase result", &byte_reader::u8);
  if (!v) return std::move(v).error();
  return *v != 0;
}

expected<void> tcp_store::wait(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  if (keys.empty()) return ok();
  auto r = impl_->call(
      wire::kind::wait, 0,
      [&](byte_writer& w) {
        w.u32(static_cast<std::uint32_t>(keys.size()));
        for (const auto& k : keys) w.str(k);
      },
      timeout, "wait", [&] { return "keys " + detail::quote_keys(keys); }, true);
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
      wire::kind::num_keys, prefix.size() + 4, [&](byte_writer& w) { w.str(prefix); }, timeout,
      "num_keys", [] { return std::string("the key count"); }, false);
  return read_reply<std::int64_t>(std::move(r), "key count", &byte_reader::i64);
}

}  // namespace troupe
