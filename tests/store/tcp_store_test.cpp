// TCP-specific behaviour: binding, dead servers, hostile bytes, frame limits, secrets.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <troupe/core/log.hpp>
#include <troupe/store/detail/wire.hpp>
#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "raw_socket.hpp"
#include "settled_output.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tcp_store;
using troupe::tcp_store_server;
using troupe::testing::raw_socket;

std::unique_ptr<tcp_store_server> start_server(troupe::tcp_store_server_options o = {}) {
  auto s = tcp_store_server::start(std::move(o));
  REQUIRE(s.has_value());
  return std::move(*s);
}

troupe::expected<std::unique_ptr<tcp_store>> connect_to(const tcp_store_server& server,
                                                        std::string secret = {},
                                                        std::size_t max_frame = 64u << 20) {
  troupe::tcp_store_options o;
  o.port = server.port();
  o.secret = std::move(secret);
  o.connect_timeout = 3s;
  o.max_frame_size = max_frame;
  return tcp_store::connect(std::move(o));
}

// Captures warnings logged while it lives.
class log_capture {
 public:
  log_capture() {
    troupe::set_log_sink([this](std::string_view line) {
      std::lock_guard lk(mu_);
      text_ += std::string(line) + "\n";
    });
  }
  ~log_capture() { troupe::set_log_sink(nullptr); }
  std::string text() {
    std::lock_guard lk(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

// The server still answers a well-behaved client.
void check_serves(const tcp_store_server& server) {
  auto c = connect_to(server);
  REQUIRE(c.has_value());
  REQUIRE((*c)->set("still-serving", std::string_view("yes")));
  CHECK(troupe::to_string((*c)->get("still-serving", 5s).value()) == "yes");
}

// Completes a good hello on a raw connection and reads the server's answer.
void say_hello(raw_socket& sock) {
  REQUIRE(sock.send(troupe::detail::wire::encode_hello(
      {troupe::detail::wire::magic, troupe::detail::wire::version, "", "raw"})));
  auto reply_len = sock.receive(4);
  REQUIRE(reply_len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(reply_len[0]) |
           std::to_integer<std::uint32_t>(reply_len[1]) << 8;
  REQUIRE(sock.receive(n).size() == n);
}

}  // namespace

TEST_CASE("the tcp store server binds 127.0.0.1 by default and reports the port it picked") {
  auto server = start_server();
  CHECK(server->host() == "127.0.0.1");
  CHECK(server->port() != 0);
  CHECK(server->url() == "tcp://127.0.0.1:" + std::to_string(server->port()));
}

TEST_CASE("the tcp store server refuses an empty host instead of binding every interface") {
  troupe::tcp_store_server_options o;
  o.host = "";
  auto s = tcp_store_server::start(o);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code() == errc::invalid_argument);
}

TEST_CASE("a client blocked in get fails with connection_lost soon after the server shuts down") {
  auto server = start_server();
  auto client = connect_to(*server).value();
  troupe::expected<troupe::bytes> got = troupe::make_error(errc::internal, "not run");
  auto start = std::chrono::steady_clock::now();
  std::thread blocked([&] { got = client->get("never-written", 30s); });
  // Whether the get reaches the server before the shutdown or not, it must fail promptly.
  server->shutdown(5s);
  blocked.join();
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  REQUIRE_FALSE(got.has_value());
  CHECK(got.error().code() == errc::connection_lost);
  // The error is sticky: later calls fail the same way at once.
  auto later = client->set("k", std::string_view("v"));
  REQUIRE_FALSE(later.has_value());
  CHECK(later.error().code() == errc::connection_lost);
  CHECK(client->connection_error().has_value());
}

TEST_CASE("shutting the server down twice is harmless") {
  auto server = start_server();
  auto client = connect_to(*server).value();
  server->shutdown(2s);
  server->shutdown(2s);
  CHECK(client->num_keys(1s).error().code() == errc::connection_lost);
}

TEST_CASE("garbage bytes and half frames close only their own connections") {
  log_capture logs;
  auto server = start_server();
  auto keeper = connect_to(*server).value();
  REQUIRE(keeper->set("before", std::string_view("1")));

  raw_socket http(server->port());
  REQUIRE(http.connected());
  REQUIRE(http.send(std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")));

  raw_socket bad_magic(server->port());
  troupe::bytes hello = troupe::detail::wire::encode_hello({0xdeadbeef, 1, "", "test"});
  REQUIRE(bad_magic.send(hello));

  raw_socket tiny(server->port());
  const std::uint8_t too_short[] = {2, 0, 0, 0, 1, 0};
  REQUIRE(tiny.send(too_short, sizeof(too_short)));

  raw_socket half(server->port());
  troupe::bytes good =
      troupe::detail::wire::encode_hello({troupe::detail::wire::magic, 1, "", "half"});
  REQUIRE(half.send(good.data(), good.size() / 2));

  CHECK(http.closed_by_peer());
  CHECK(bad_magic.closed_by_peer());
  CHECK(tiny.closed_by_peer());
  // The half frame stays pending without blocking anyone.
  check_serves(*server);
  CHECK(troupe::to_string(keeper->get("before", 5s).value()) == "1");
  CHECK(logs.text().find("closing the connection") != std::string::npos);
}

TEST_CASE("a malformed request after a good hello closes only that connection") {
  auto server = start_server();
  raw_socket sock(server->port());
  say_hello(sock);
  // A set whose key claims more bytes than the frame holds.
  troupe::detail::wire::frame_builder f(troupe::detail::wire::kind::set, 1);
  f.writer().u32(1000);
  f.writer().raw("abc", 3);
  REQUIRE(sock.send(std::move(f).finish()));
  CHECK(sock.closed_by_peer());
  check_serves(*server);
}

TEST_CASE("a client with another protocol version is refused with protocol_error") {
  auto server = start_server();
  raw_socket sock(server->port());
  REQUIRE(sock.send(
      troupe::detail::wire::encode_hello({troupe::detail::wire::magic, 99, "", "future"})));
  auto len = sock.receive(4);
  REQUIRE(len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  auto body = sock.receive(n);
  REQUIRE(body.size() == n);
  std::span<const std::byte> payload(body);
  troupe::byte_reader r(payload.subspan(troupe::detail::wire::min_body));
  auto status = troupe::detail::wire::decode_reply_status(r);
  REQUIRE_FALSE(status.has_value());
  CHECK(status.error().code() == errc::protocol_error);
  CHECK(sock.closed_by_peer());
}

TEST_CASE("an oversized frame closes only the connection that sent it") {
  log_capture logs;
  troupe::tcp_store_server_options o;
  o.max_frame_size = 1024;
  auto server = start_server(o);
  auto big_sender = connect_to(*server, {}, 1u << 20).value();
  auto bystander = connect_to(*server, {}, 1024).value();
  troupe::bytes big(4096, std::byte{'x'});
  auto r = big_sender->set("big", big, 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::connection_lost);
  CHECK(bystander->set("small", std::string_view("ok")).has_value());
  CHECK(bystander->num_keys(5s).value() == 1);
  CHECK(logs.text().find("exceeds the limit of 1024") != std::string::npos);
}

TEST_CASE("a client refuses to send a frame over its own limit") {
  auto server = start_server();
  auto client = connect_to(*server, {}, 256).value();
  troupe::bytes big(1000, std::byte{'x'});
  auto r = client->set("big", big, 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(client->set("small", std::string_view("fine")).has_value());
}

TEST_CASE("a server with a secret refuses clients with a wrong or missing secret") {
  troupe::tcp_store_server_options o;
  o.secret = "s3cret";
  auto server = start_server(o);
  auto missing = connect_to(*server);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == errc::unauthorized);
  CHECK(missing.error().message().find("same secret") != std::string::npos);
  auto wrong = connect_to(*server, "guess");
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code() == errc::unauthorized);
  auto right = connect_to(*server, "s3cret");
  REQUIRE(right.has_value());
  CHECK((*right)->set("k", std::string_view("v")).has_value());
}

TEST_CASE("the secret is proven, never sent: no frame from the client carries it") {
  // A relay between client and server records what the client sends.
  troupe::tcp_store_server_options o;
  o.secret = "a-secret-that-must-not-travel";
  auto server = start_server(o);
  auto c = connect_to(*server, o.secret);
  REQUIRE(c.has_value());
  namespace wire = troupe::detail::wire;
  // Speak the handshake by hand, as the client does, and look at every byte sent.
  raw_socket sock(server->port());
  std::string nonce(16, 'c');
  auto hello = wire::encode_hello({wire::magic, wire::version, nonce, "raw"});
  REQUIRE(sock.send(hello));
  auto len = sock.receive(4);
  REQUIRE(len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  auto body = sock.receive(n);
  auto ch = wire::decode_challenge(body);
  REQUIRE(ch.has_value());
  // The server proves that it knows the secret for these nonces.
  CHECK(ch->proof == wire::handshake_proof("server", o.secret, nonce, ch->nonce));
  CHECK(ch->proof != wire::handshake_proof("server", "another", nonce, ch->nonce));
  auto auth =
      wire::encode_auth({true, wire::handshake_proof("client", o.secret, nonce, ch->nonce)});
  REQUIRE(sock.send(auth));
  std::string sent(reinterpret_cast<const char*>(hello.data()), hello.size());
  sent.append(reinterpret_cast<const char*>(auth.data()), auth.size());
  CHECK(sent.find(o.secret) == std::string::npos);
  len = sock.receive(4);
  REQUIRE(len.size() == 4);
  n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  body = sock.receive(n);
  REQUIRE_FALSE(body.empty());
  CHECK(body[0] == std::byte{static_cast<std::uint8_t>(wire::kind::hello_ok)});
}

TEST_CASE("a proof replayed on another connection is refused and logged with the peer's address") {
  troupe::tcp_store_server_options o;
  o.secret = "s3cret";
  auto server = start_server(o);
  namespace wire = troupe::detail::wire;
  log_capture logs;
  // A proof made for one server nonce does not open a connection that got another.
  raw_socket sock(server->port());
  std::string nonce(16, 'c');
  REQUIRE(sock.send(wire::encode_hello({wire::magic, wire::version, nonce, "replayer"})));
  auto len = sock.receive(4);
  REQUIRE(len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  auto ch = wire::decode_challenge(sock.receive(n));
  REQUIRE(ch.has_value());
  REQUIRE(sock.send(wire::encode_auth(
      {true, wire::handshake_proof("client", o.secret, nonce, std::string(16, 'x'))})));
  len = sock.receive(4);
  REQUIRE(len.size() == 4);
  n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  auto body = sock.receive(n);
  REQUIRE_FALSE(body.empty());
  CHECK(body[0] == std::byte{static_cast<std::uint8_t>(wire::kind::reply)});
  CHECK(logs.text().find("refusing 127.0.0.1:") != std::string::npos);  // logged before the reply
  CHECK(logs.text().find("refused the client's proof") != std::string::npos);
}

TEST_CASE("a client with a secret refuses a store that asks for none") {
  auto open_server = start_server();
  auto c = connect_to(*open_server, "s3cret");
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == errc::unauthorized);
  CHECK(c.error().message().find("requires no secret but this client has one") !=
        std::string::npos);
}

TEST_CASE("connecting where no server listens times out naming the address") {
  std::uint16_t port = 0;
  {
    auto gone = start_server();
    port = gone->port();
  }
  troupe::tcp_store_options o;
  o.port = port;
  o.connect_timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  auto c = tcp_store::connect(o);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == errc::timeout);
  CHECK(c.error().message().find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("a client on this host reaches the server through its local socket") {
  auto server = start_server();
  CHECK(server->has_local_socket());
  auto c = connect_to(*server).value();
  CHECK(c->connected_locally());
  REQUIRE(c->set("k", std::string_view("v")));
  CHECK(troupe::to_string(c->get("k", 5s).value()) == "v");
}

TEST_CASE("either side can keep clients on TCP, and both kinds of client share one table") {
  troupe::tcp_store_server_options so;
  so.local_socket = false;
  auto tcp_server = start_server(so);
  CHECK_FALSE(tcp_server->has_local_socket());
  auto c = connect_to(*tcp_server).value();
  CHECK_FALSE(c->connected_locally());  // tried the local name, found none, used TCP
  REQUIRE(c->set("k", std::string_view("over tcp")));

  auto server = start_server();
  troupe::tcp_store_options o;
  o.port = server->port();
  o.connect_timeout = 3s;
  o.local_socket = false;
  auto over_tcp = tcp_store::connect(o).value();
  auto local = connect_to(*server).value();
  CHECK_FALSE(over_tcp->connected_locally());
  CHECK(local->connected_locally());
  // A waiter on one kind of connection is woken by a set on the other.
  std::thread waiter([&] { CHECK(troupe::to_string(over_tcp->get("shared", 5s).value()) == "x"); });
  REQUIRE(local->set("shared", std::string_view("x")));
  waiter.join();
  CHECK(server->num_connections() == 2);
}

TEST_CASE("the local socket is named after the address and port the server bound") {
  auto server = start_server();
  auto name = troupe::local_socket_name(server->host(), server->port());
  REQUIRE_FALSE(name.empty());
  CHECK(name[0] == '\0');  // abstract namespace: nothing in the file system
  CHECK(name.find(server->host() + ":" + std::to_string(server->port())) != std::string::npos);
  // Servers on other loopback addresses with the same port have other names, so a client
  // never reaches the wrong one.
  CHECK(troupe::local_socket_name("127.0.0.2", server->port()) != name);
}

TEST_CASE("a timed-out get leaves the client usable and a later get succeeds") {
  auto server = start_server();
  auto client = connect_to(*server).value();
  auto r = client->get("late", 50ms);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::timeout);
  REQUIRE(client->set("late", std::string_view("here")));
  CHECK(troupe::to_string(client->get("late", 5s).value()) == "here");
}

TEST_CASE("many clients pipeline requests from many threads") {
  auto server = start_server();
  constexpr int clients = 4;
  constexpr int threads_per_client = 4;
  constexpr int ops = 50;
  std::vector<std::unique_ptr<tcp_store>> handles;
  for (int i = 0; i < clients; ++i) handles.push_back(connect_to(*server).value());
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int c = 0; c < clients; ++c) {
    for (int t = 0; t < threads_per_client; ++t) {
      pool.emplace_back([&, c, t] {
        auto& h = *handles[static_cast<std::size_t>(c)];
        for (int i = 0; i < ops; ++i) {
          std::string key =
              "k-" + std::to_string(c) + "-" + std::to_string(t) + "-" + std::to_string(i);
          if (!h.set(key, std::string_view(key))) failures++;
          auto v = h.get(key, 5s);
          if (!v || troupe::to_string(*v) != key) failures++;
          if (!h.add("total", 1)) failures++;
        }
      });
    }
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  CHECK(handles[0]->add("total", 0).value() == clients * threads_per_client * ops);
  CHECK(server->num_connections() == clients);
}

TEST_CASE("threads sharing one client get their own replies while another thread waits") {
  auto server = start_server();
  auto c = connect_to(*server);
  REQUIRE(c.has_value());
  auto& client = **c;
  // This thread blocks in get and is likely to hold the reader role meanwhile.
  std::thread waiter([&] {
    auto v = client.get("released-last", 10s);
    REQUIRE(v.has_value());
    CHECK(troupe::to_string(*v) == "done");
  });
  std::vector<std::thread> workers;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t)
    workers.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto key = "t" + std::to_string(t) + "/" + std::to_string(i);
        if (!client.set(key, std::string_view(key))) return;
        auto v = client.get(key, 5s);
        if (v && troupe::to_string(*v) == key) good.fetch_add(1);
      }
    });
  for (auto& w : workers) w.join();
  CHECK(good.load() == 800);
  REQUIRE(client.set("released-last", std::string_view("done")));
  waiter.join();
}

TEST_CASE("a waiter whose deadline passes hands the reading over to the others") {
  auto server = start_server();
  auto c = connect_to(*server);
  REQUIRE(c.has_value());
  auto& client = **c;
  auto other = connect_to(*server);
  REQUIRE(other.has_value());
  std::atomic<bool> long_done{false};
  std::thread long_waiter([&] {
    auto v = client.get("late-key", 10s);
    CHECK(v.has_value());
    long_done = true;
  });
  // A short get on the same client times out; the long one must still be answered.
  auto short_get = client.get("never-set", 200ms);
  REQUIRE_FALSE(short_get.has_value());
  CHECK(short_get.error().code() == errc::timeout);
  CHECK_FALSE(long_done.load());
  REQUIRE((*other)->set("late-key", std::string_view("here")));
  long_waiter.join();
  CHECK(long_done.load());
  // The connection is still healthy for new calls.
  CHECK(client.set("after", std::string_view("ok")));
}

TEST_CASE(
    "a client that sends requests but never reads cannot make the server buffer without bound") {
  troupe::tcp_store_server_options o;
  o.max_queued_output = 1u << 20;
  auto server = start_server(o);
  auto writer = connect_to(*server).value();
  const std::size_t value_size = 64u << 10;
  REQUIRE(writer->set("big", troupe::bytes(value_size, std::byte{'v'})));

  namespace wire = troupe::detail::wire;
  auto sock = std::make_unique<raw_socket>(server->port());
  REQUIRE(sock->send(wire::encode_hello({wire::magic, wire::version, "", "never-reads"})));
  auto len = sock->receive(4);
  REQUIRE(len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  REQUIRE(sock->receive(n).size() == n);
  // 400 gets of 64 KiB in one burst: 25 MiB of replies if the server answered them all.
  troupe::bytes burst;
  for (std::uint64_t id = 1; id <= 400; ++id) {
    wire::frame_builder f(wire::kind::get, id);
    f.writer().str("big");
    auto frame = std::move(f).finish();
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  REQUIRE(sock->send(burst));

  // Wait for the queue to settle (the same reading for 300 ms), then look at it.
  const std::size_t last = troupe::test::settled_queued_output(*server);
  CHECK(last > 0);
  CHECK(last <= o.max_queued_output + value_size + 64);
  check_serves(*server);

  // Once the client goes away, its queued replies are dropped.
  sock.reset();
  for (int i = 0; i < 250 && server->queued_output_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(server->queued_output_bytes() == 0);
}

TEST_CASE(
    "a client woken with more than max_unread_output that it never reads is dropped and its queue "
    "freed") {
  troupe::tcp_store_server_options o;
  o.max_queued_output = 1u << 20;
  o.max_unread_output = 4u << 20;
  auto server = start_server(o);
  auto writer = connect_to(*server).value();

  namespace wire = troupe::detail::wire;
  auto sock = std::make_unique<raw_socket>(server->port(), 4096);
  REQUIRE(sock->send(wire::encode_hello({wire::magic, wire::version, "", "never-reads"})));
  auto len = sock->receive(4);
  REQUIRE(len.size() == 4);
  auto n = std::to_integer<std::uint32_t>(len[0]) | std::to_integer<std::uint32_t>(len[1]) << 8;
  REQUIRE(sock->receive(n).size() == n);
  // 400 gets of a key nobody has set yet: each parks, and each is woken with the value.
  troupe::bytes burst;
  for (std::uint64_t id = 1; id <= 400; ++id) {
    wire::frame_builder f(wire::kind::get, id);
    f.writer().str("late");
    auto frame = std::move(f).finish();
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  REQUIRE(sock->send(burst));
  // Let the server park them all (a check from the same kind of client is answered after).
  for (int i = 0; i < 50; ++i) std::this_thread::sleep_for(10ms);
  // 400 wakes of 64 KiB: 25 MiB, far past the hard limit, all produced by another client.
  REQUIRE(writer->set("late", troupe::bytes(64u << 10, std::byte{'v'})));

  // The server drops the reader: its queue is freed and it reads end of stream.
  for (int i = 0; i < 250 && server->queued_output_bytes() != 0; ++i)
    std::this_thread::sleep_for(20ms);
  CHECK(server->queued_output_bytes() == 0);
  CHECK(sock->closed_by_peer());
  check_serves(*server);
}

TEST_CASE("max_unread_output below max_queued_output is refused at start, naming both") {
  troupe::tcp_store_server_options o;
  o.max_queued_output = 4u << 20;
  o.max_unread_output = 1u << 20;
  auto server = troupe::tcp_store_server::start(o);
  REQUIRE_FALSE(server.has_value());
  CHECK(server.error().code() == errc::invalid_argument);
  CHECK(server.error().message().find("max_unread_output") != std::string::npos);
  CHECK(server.error().message().find("max_queued_output") != std::string::npos);
}

TEST_CASE("a quiet set is seen by the same client's next call and by other clients once applied") {
  auto server = start_server();
  auto a = connect_to(*server).value();
  auto b = connect_to(*server).value();
  for (int i = 0; i < 100; ++i) REQUIRE(a->set_nowait("n", std::to_string(i)));
  // One connection keeps order: the get is read after every quiet set before it.
  CHECK(troupe::to_string(a->get("n", 5s).value()) == "99");
  // Another client's blocking get waits for the key, wherever the set is in flight.
  std::thread waiter([&] { CHECK(troupe::to_string(b->get("late", 5s).value()) == "here"); });
  REQUIRE(a->set_nowait("late", std::string_view("here")));
  waiter.join();
}

TEST_CASE("a quiet set checks its key before sending it") {
  auto server = start_server();
  auto c = connect_to(*server).value();
  auto r = c->set_nowait("", std::string_view("v"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(c->set("still", std::string_view("fine")));
}

TEST_CASE("after a quiet set to a server that has gone, the next call fails with connection_lost") {
  auto server = start_server();
  auto c = connect_to(*server).value();
  REQUIRE(c->set_nowait("k", std::string_view("v")));
  server->shutdown(5s);
  // The quiet set may still be handed to the kernel; the next call that waits must fail.
  (void)c->set_nowait("k2", std::string_view("v"));
  auto r = c->get("k", 5s);
  REQUIRE_FALSE(r.has_value());
  CHECK((r.error().code() == errc::connection_lost || r.error().code() == errc::shut_down));
  auto again = c->set_nowait("k3", std::string_view("v"));
  REQUIRE_FALSE(again.has_value());  // the sticky error
}

TEST_CASE("a quiet set with a bad key closes only the connection that sent it") {
  auto server = start_server();
  raw_socket sock(server->port());
  say_hello(sock);
  troupe::detail::wire::frame_builder f(troupe::detail::wire::kind::set_quiet, 0);
  f.writer().str("");
  f.writer().blob(troupe::bytes{});
  REQUIRE(sock.send(std::move(f).finish()));
  CHECK(sock.closed_by_peer());
  check_serves(*server);
}
