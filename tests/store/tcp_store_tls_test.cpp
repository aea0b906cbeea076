// Mutual TLS between the TCP store's clients and its server over TCP (the local socket
// stays plain): every operation, and the refusal of a plain client, of a TLS client by a
// plain server, of a certificate from another CA and of a client that never finishes its
// handshake. Real sockets on loopback; a throwaway CA made with the openssl command.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/log.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/detail/wire.hpp>
#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "raw_socket.hpp"
#include "settled_output.hpp"
#include "support/skip.hpp"
#include "support/test_pki.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tcp_store;
using troupe::tcp_store_server;
using troupe::testing::raw_socket;
namespace test = troupe::test;
namespace tls = troupe::tls;

// One CA for the whole suite (each costs a few openssl runs).
const test::test_pki* pki() {
  static auto made = test::test_pki::make();
  return made ? made->get() : nullptr;
}

tls::config server_identity() { return {pki()->server_cert(), pki()->server_key(), pki()->ca()}; }
tls::config client_identity() { return {pki()->client_cert(), pki()->client_key(), pki()->ca()}; }

std::unique_ptr<tcp_store_server> start_server(tls::config identity, std::string secret = {},
                                               troupe::duration hello_timeout = 10s) {
  troupe::tcp_store_server_options o;
  o.tls = std::move(identity);
  o.secret = std::move(secret);
  o.hello_timeout = hello_timeout;
  auto s = tcp_store_server::start(std::move(o));
  REQUIRE_MESSAGE(s, (s ? "" : s.error().to_string()));
  return std::move(*s);
}

// A client over TCP (never the local socket).
troupe::expected<std::unique_ptr<tcp_store>> connect(const tcp_store_server& server,
                                                     tls::config identity,
                                                     std::string secret = {}) {
  troupe::tcp_store_options o;
  o.port = server.port();
  o.local_socket = false;
  o.connect_timeout = 10s;
  o.timeout = 10s;
  o.tls = std::move(identity);
  o.secret = std::move(secret);
  return tcp_store::connect(std::move(o));
}

std::unique_ptr<tcp_store> connect_ok(const tcp_store_server& server, tls::config identity,
                                      std::string secret = {}) {
  auto c = connect(server, std::move(identity), std::move(secret));
  REQUIRE_MESSAGE(c, (c ? "" : c.error().to_string()));
  return std::move(*c);
}

// Collects the lines logged while it lives.
struct log_capture {
  std::mutex mu;
  std::vector<std::string> lines;
  log_capture() {
    troupe::set_log_sink([this](std::string_view line) {
      std::lock_guard<std::mutex> lk(mu);
      lines.emplace_back(line);
    });
  }
  ~log_capture() { troupe::set_log_sink(nullptr); }
  bool has(std::initializer_list<std::string_view> parts) {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& l : lines) {
      bool all = true;
      for (auto p : parts) all = all && l.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
  // Waits (bounded) for a line with every part: the server logs from its own threads.
  bool eventually(std::initializer_list<std::string_view> parts) {
    for (auto until = troupe::deadline::after(5s); !until.expired();) {
      if (has(parts)) return true;
      std::this_thread::sleep_for(10ms);
    }
    return has(parts);
  }
};

bool mentions(const troupe::error& e, std::string_view text) {
  return e.message().find(text) != std::string::npos;
}

std::string addr(const tcp_store_server& s) { return troupe::strcat("127.0.0.1:", s.port()); }

// A TLS client that speaks the store's frames by hand over a blocking socket (every receive
// gives up after 5 s), for clients that misbehave after their handshake.
class raw_tls_client {
 public:
  explicit raw_tls_client(std::uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    auto ctx = tls::context::make(client_identity());
    REQUIRE(ctx);
    auto s = tls::session::make(*ctx, true);
    REQUIRE(s);
    session_ = std::move(*s);
  }
  ~raw_tls_client() { ::close(fd_); }
  raw_tls_client(const raw_tls_client&) = delete;
  raw_tls_client& operator=(const raw_tls_client&) = delete;

  // The TLS handshake, then a hello without a secret and its hello_ok.
  void open() {
    for (int i = 0; i < 100; ++i) {
      auto done = session_->handshake();
      REQUIRE_MESSAGE(done, (done ? "" : done.error().to_string()));
      flush();
      if (*done) break;
      REQUIRE(receive_some());
    }
    REQUIRE(session_->established());
    namespace wire = troupe::detail::wire;
    send(wire::encode_hello({wire::magic, wire::version, "", "raw tls"}));
    troupe::bytes plain;
    while (plain.size() < wire::length_size + wire::min_body) {
      REQUIRE(receive_some());
      std::array<std::byte, 4096> out{};
      auto n = session_->read(out);
      REQUIRE(n);
      plain.insert(plain.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(*n));
    }
    CHECK(plain[wire::length_size] == std::byte{static_cast<std::uint8_t>(wire::kind::hello_ok)});
  }

  // Encrypts and sends all of `plain`.
  void send(const troupe::bytes& plain) {
    REQUIRE(session_->write(plain));
    flush();
  }

  // True when the server closes the connection (end of stream or a reset) within 5 s;
  // whatever it sent first is skipped.
  bool closed_by_peer() {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

 private:
  void flush() {
    troupe::bytes out;
    session_->take_output(out);
    std::size_t off = 0;
    while (off < out.size()) {
      ssize_t n = ::send(fd_, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }
  bool receive_some() {
    std::array<std::byte, 16384> buf{};
    ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n <= 0) return false;
    session_->put_input(std::span<const std::byte>(buf.data(), static_cast<std::size_t>(n)));
    return true;
  }

  int fd_ = -1;
  std::unique_ptr<tls::session> session_;
};

// 400 gets of `key` in one burst of frames.
troupe::bytes burst_of_gets(std::string_view key) {
  namespace wire = troupe::detail::wire;
  troupe::bytes burst;
  for (std::uint64_t id = 1; id <= 400; ++id) {
    wire::frame_builder f(wire::kind::get, id);
    f.writer().str(key);
    auto frame = std::move(f).finish();
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  return burst;
}

void check_serves(const tcp_store_server& server) {
  auto c = connect_ok(server, client_identity());
  REQUIRE(c->set("still-serving", std::string_view("yes")));
  CHECK(troupe::to_string(c->get("still-serving", 5s).value()) == "yes");
}

}  // namespace

#define REQUIRE_PKI()                                                                  \
  do {                                                                                 \
    if (!test::test_pki::available()) TROUPE_SKIP_TEST(test::test_pki::skip_reason()); \
    REQUIRE(pki() != nullptr);                                                         \
  } while (false)

TEST_CASE(
    "a store client and server with the job's certificates set, get, add, compare_set and wait "
    "over TLS") {
  REQUIRE_PKI();
  auto server = start_server(server_identity());
  CHECK(server->uses_tls());
  auto c = connect_ok(*server, client_identity());
  CHECK(c->uses_tls());
  CHECK_FALSE(c->connected_locally());

  REQUIRE(c->set("k", std::string_view("v")));
  CHECK(troupe::to_string(c->get("k", 5s).value()) == "v");
  CHECK(c->add("n", 5).value() == 5);
  CHECK(c->add("n", -2).value() == 3);
  auto now = c->compare_set("cas", std::nullopt, troupe::to_bytes("first"), 5s);
  REQUIRE(now);
  CHECK(troupe::to_string(*now) == "first");
  now = c->compare_set("cas", troupe::to_bytes("wrong"), troupe::to_bytes("second"), 5s);
  REQUIRE(now);
  CHECK(troupe::to_string(*now) == "first");
  now = c->compare_set("cas", troupe::to_bytes("first"), troupe::to_bytes("second"), 5s);
  REQUIRE(now);
  CHECK(troupe::to_string(*now) == "second");
  CHECK(c->erase("k", 5s).value());
  CHECK(c->num_keys(5s).value() == 2);
  REQUIRE(c->set_nowait("quiet", "q"));
  CHECK(troupe::to_string(c->get("quiet", 5s).value()) == "q");

  // 4 MiB each way: many TLS records per frame.
  std::string big(std::size_t{4} << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>('a' + i % 26);
  REQUIRE(c->set("big", std::string_view(big)));
  CHECK(troupe::to_string(c->get("big", 10s).value()) == big);

  // A wait and a get that another client's writes wake (replies sent from its thread).
  auto other = connect_ok(*server, client_identity());
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    CHECK(other->set("later-1", std::string_view("1")));
    CHECK(other->set("later-2", std::string_view("2")));
  });
  std::array<std::string, 2> keys{"later-1", "later-2"};
  CHECK(c->wait(keys, 10s));
  CHECK(troupe::to_string(c->get("later-2", 10s).value()) == "2");
  writer.join();
  auto missing = c->get("never", 200ms);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code() == errc::timeout);
  CHECK(c->set("after-a-timeout", std::string_view("fine")));
}

TEST_CASE("many threads share one TLS client and every reply reaches its caller") {
  REQUIRE_PKI();
  auto server = start_server(server_identity());
  auto c = connect_ok(*server, client_identity());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto key = troupe::strcat("t", t, "/", i);
        CHECK(c->set(key, std::string_view(key)));
        CHECK(troupe::to_string(c->get(key, 10s).value()) == key);
      }
      CHECK(c->add("sum", 1).has_value());
    });
  for (auto& th : threads) th.join();
  CHECK(c->add("sum", 0).value() == 8);
}

TEST_CASE("the secret handshake runs inside TLS, and a wrong secret is still refused") {
  REQUIRE_PKI();
  auto server = start_server(server_identity(), "job-secret");
  auto c = connect_ok(*server, client_identity(), "job-secret");
  REQUIRE(c->set("k", std::string_view("v")));
  auto wrong = connect(*server, client_identity(), "other-secret");
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code() == errc::unauthorized);
}

TEST_CASE(
    "a client without TLS is refused by a TLS server at once, and told to set TROUPE_TLS_* on both "
    "sides") {
  REQUIRE_PKI();
  log_capture logs;
  auto server = start_server(server_identity());
  auto started = std::chrono::steady_clock::now();
  auto plain = connect(*server, {});
  auto took = std::chrono::steady_clock::now() - started;
  REQUIRE_FALSE(plain);
  CHECK(plain.error().code() == errc::unauthorized);
  CHECK_MESSAGE(mentions(plain.error(), addr(*server)), plain.error().message());
  CHECK_MESSAGE(mentions(plain.error(), "requires TLS"), plain.error().message());
  CHECK_MESSAGE(mentions(plain.error(), "TROUPE_TLS_CERT"), plain.error().message());
  CHECK_FALSE(mentions(plain.error(), "secret"));
  CHECK(took < 3s);  // no retries until connect_timeout
  CHECK(logs.eventually({"refusing 127.0.0.1:", "without TLS", "TROUPE_TLS_CERT"}));
  // The server serves on.
  auto c = connect_ok(*server, client_identity());
  CHECK(c->set("k", std::string_view("v")));
}

TEST_CASE("a TLS client is refused by a server without TLS at once, naming the server's address") {
  REQUIRE_PKI();
  log_capture logs;
  troupe::tcp_store_server_options o;
  auto made = tcp_store_server::start(o);
  REQUIRE(made);
  auto& server = **made;
  CHECK_FALSE(server.uses_tls());
  auto started = std::chrono::steady_clock::now();
  auto c = connect(server, client_identity());
  auto took = std::chrono::steady_clock::now() - started;
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == errc::unauthorized);
  CHECK_MESSAGE(mentions(c.error(), addr(server)), c.error().message());
  CHECK_MESSAGE(mentions(c.error(), "without TLS"), c.error().message());
  CHECK_MESSAGE(mentions(c.error(), "TROUPE_TLS_CERT"), c.error().message());
  CHECK(took < 3s);
  CHECK(logs.eventually({"refusing 127.0.0.1:", "does not use TLS", "TROUPE_TLS_CERT"}));
  troupe::tcp_store_options po;
  po.port = server.port();
  po.local_socket = false;
  auto plain = tcp_store::connect(po);
  REQUIRE(plain);
  CHECK((*plain)->set("k", std::string_view("v")));
}

TEST_CASE("a certificate that another CA signed is refused, on either side") {
  REQUIRE_PKI();
  auto server = start_server(server_identity());
  auto stranger = connect(*server, {pki()->stranger_cert(), pki()->stranger_key(), pki()->ca()});
  REQUIRE_FALSE(stranger);
  CHECK(stranger.error().code() == errc::unauthorized);
  CHECK_MESSAGE(mentions(stranger.error(), addr(*server)), stranger.error().message());

  auto other = start_server({pki()->other_node_cert(), pki()->other_node_key(), pki()->other_ca()});
  auto c = connect(*other, client_identity());
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == errc::unauthorized);
  CHECK_MESSAGE(mentions(c.error(), "not signed by this job's CA"), c.error().message());
}

TEST_CASE(
    "a client that never completes the TLS handshake is dropped after hello_timeout and the server "
    "serves on") {
  REQUIRE_PKI();
  log_capture logs;
  auto server = start_server(server_identity(), {}, 300ms);
  raw_socket silent(server->port());
  REQUIRE(silent.connected());
  raw_socket stalled(server->port());
  REQUIRE(stalled.connected());
  // The start of a TLS record, then nothing: the handshake never ends.
  const unsigned char head[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01};
  REQUIRE(stalled.send(head, sizeof head));
  auto c = connect_ok(*server, client_identity());
  CHECK(c->set("k", std::string_view("v")));
  auto started = std::chrono::steady_clock::now();
  CHECK(silent.closed_by_peer());
  CHECK(stalled.closed_by_peer());
  CHECK(std::chrono::steady_clock::now() - started < 4s);
  CHECK(logs.eventually({"no hello within"}));
  // The client admitted before is not affected.
  CHECK(troupe::to_string(c->get("k", 5s).value()) == "v");
  // The server forgets a connection just after closing its socket.
  for (int i = 0; i < 250 && server->num_connections() != 1; ++i) std::this_thread::sleep_for(20ms);
  CHECK(server->num_connections() == 1);
}

TEST_CASE(
    "a TLS client on the server's host reaches a loopback server through its plain local socket") {
  REQUIRE_PKI();
  auto server = start_server(server_identity());
  REQUIRE(server->has_local_socket());
  troupe::tcp_store_options o;
  o.port = server->port();
  o.tls = client_identity();
  auto c = tcp_store::connect(o);
  REQUIRE_MESSAGE(c, (c ? "" : c.error().to_string()));
  CHECK((*c)->connected_locally());
  CHECK_FALSE((*c)->uses_tls());
  CHECK((*c)->set("k", std::string_view("v")));
}

TEST_CASE(
    "connect_store takes the TLS identity from TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA") {
  REQUIRE_PKI();
  troupe::tcp_store_server_options so;
  so.tls = server_identity();
  so.local_socket = false;  // clients on this host use TCP too
  auto server = tcp_store_server::start(so);
  REQUIRE(server);
  ::setenv("TROUPE_TLS_CERT", pki()->client_cert().c_str(), 1);
  ::setenv("TROUPE_TLS_KEY", pki()->client_key().c_str(), 1);
  ::setenv("TROUPE_TLS_CA", pki()->ca().c_str(), 1);
  auto s = troupe::connect_store((*server)->url());
  for (const char* v : {"TROUPE_TLS_CERT", "TROUPE_TLS_KEY", "TROUPE_TLS_CA"}) ::unsetenv(v);
  REQUIRE_MESSAGE(s, (s ? "" : s.error().to_string()));
  CHECK((*s)->set("k", std::string_view("v")));
  auto* tcp = dynamic_cast<tcp_store*>(s->get());
  REQUIRE(tcp != nullptr);
  CHECK(tcp->uses_tls());
}

TEST_CASE(
    "unusable TLS files fail the server's start and the client's connect, naming the setting and "
    "the file") {
  REQUIRE_PKI();
  troupe::tcp_store_server_options so;
  so.tls = {pki()->server_cert(), "/nonexistent/server.key", pki()->ca()};
  auto server = tcp_store_server::start(so);
  REQUIRE_FALSE(server);
  CHECK(server.error().code() == errc::invalid_argument);
  CHECK_MESSAGE(mentions(server.error(), "TROUPE_TLS_KEY"), server.error().message());
  CHECK_MESSAGE(mentions(server.error(), "/nonexistent/server.key"), server.error().message());

  troupe::tcp_store_options o;
  o.port = 1;
  o.tls = {pki()->client_cert(), pki()->client_key(), ""};
  auto c = tcp_store::connect(o);
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == errc::invalid_argument);
  CHECK_MESSAGE(mentions(c.error(), "TROUPE_TLS_CA"), c.error().message());
}

TEST_CASE(
    "a TLS client that sends requests but never reads cannot make the server buffer without "
    "bound") {
  REQUIRE_PKI();
  troupe::tcp_store_server_options o;
  o.tls = server_identity();
  o.max_queued_output = 1u << 20;
  auto made = tcp_store_server::start(o);
  REQUIRE(made);
  auto& server = **made;
  auto writer = connect_ok(server, client_identity());
  const std::size_t value_size = 64u << 10;
  REQUIRE(writer->set("big", troupe::bytes(value_size, std::byte{'v'})));
  auto raw = std::make_unique<raw_tls_client>(server.port());
  raw->open();
  // 400 gets of 64 KiB: 25 MiB of replies (and more of ciphertext) if all were answered.
  raw->send(burst_of_gets("big"));

  // Wait for the queue to settle (the same reading for 300 ms), then look at it.
  const std::size_t last = troupe::test::settled_queued_output(server);
  CHECK(last > 0);
  // One reply past the limit at most, with its TLS records' overhead (22 bytes each).
  CHECK(last <= o.max_queued_output + value_size + 1024);
  check_serves(server);

  raw.reset();
  for (int i = 0; i < 250 && server.queued_output_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(server.queued_output_bytes() == 0);
}

TEST_CASE(
    "a TLS client woken with more than max_unread_output that it never reads is dropped and its "
    "queue freed") {
  REQUIRE_PKI();
  troupe::tcp_store_server_options o;
  o.tls = server_identity();
  o.max_queued_output = 1u << 20;
  o.max_unread_output = 4u << 20;
  auto made = tcp_store_server::start(o);
  REQUIRE(made);
  auto& server = **made;
  auto writer = connect_ok(server, client_identity());
  auto raw = std::make_unique<raw_tls_client>(server.port(), 4096);
  raw->open();
  raw->send(burst_of_gets("late"));  // each parks, and each is woken with the value
  for (int i = 0; i < 50; ++i) std::this_thread::sleep_for(10ms);
  // 400 wakes of 64 KiB, encrypted as they are queued: far past the hard limit.
  REQUIRE(writer->set("late", troupe::bytes(64u << 10, std::byte{'v'})));
  for (int i = 0; i < 250 && server.queued_output_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(server.queued_output_bytes() == 0);
  CHECK(raw->closed_by_peer());
  check_serves(server);
}
