// Mutual TLS between agents over TCP (local sockets off): calls of every kind, and the
// refusal of plain peers, of certificates from another CA, and of unusable files.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include <troupe/core/log.hpp>
#include <troupe/rpc/detail/agent_core.hpp>
#include "group_fixture.hpp"
#include "support/skip.hpp"
#include "support/test_pki.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;

namespace {

// One CA for the whole suite (each costs a few openssl runs).
const test::test_pki* pki() {
  static auto made = test::test_pki::make();
  return made ? made->get() : nullptr;
}

tls::config job_identity() {
  return tls::config{pki()->server_cert(), pki()->server_key(), pki()->ca()};
}

// Starts a static group of `n` agents over TCP, each with `identity(rank)`'s TLS files,
// and returns every init's result (none is required to succeed).
template <class Identity>
std::vector<expected<std::unique_ptr<agent>>> start_group(
    int n, Identity identity, std::shared_ptr<function_table> fns = nullptr) {
  auto s = std::make_shared<memory_store>();
  std::vector<expected<std::unique_ptr<agent>>> results;
  for (int r = 0; r < n; ++r) results.emplace_back(error(errc::internal, "not started"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto o = base_options(s);
      o.functions = fns ? fns : standard_functions();
      o.local_socket = false;
      o.init_timeout = std::chrono::seconds(5);
      o.tls = identity(r);
      results[static_cast<std::size_t>(r)] = init_rpc("w" + std::to_string(r), r, n, o);
    });
  for (auto& t : threads) t.join();
  return results;
}

// Collects warnings logged while it lives.
struct log_capture {
  std::mutex mu;
  std::vector<std::string> lines;
  log_capture() {
    set_log_sink([this](std::string_view line) {
      std::lock_guard<std::mutex> lk(mu);
      lines.emplace_back(line);
    });
  }
  ~log_capture() { set_log_sink(nullptr); }
  bool has(std::initializer_list<std::string_view> parts) {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& l : lines) {
      bool all = true;
      for (auto p : parts) all = all && l.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
};

bool mentions(const error& e, std::string_view text) {
  return e.message().find(text) != std::string::npos;
}

}  // namespace

#define REQUIRE_PKI()                                                                  \
  do {                                                                                 \
    if (!test::test_pki::available()) TROUPE_SKIP_TEST(test::test_pki::skip_reason()); \
    REQUIRE(pki() != nullptr);                                                         \
  } while (false)

TEST_CASE(
    "agents with the job's certificates make sync, async and one-way calls and echo 16 MiB over "
    "TLS") {
  REQUIRE_PKI();
  static std::atomic<int> told{0};
  auto fns = standard_functions();
  (void)fns->add("tell", [](int v) { told += v; });
  auto results = start_group(
      2, [](int) { return job_identity(); }, fns);
  std::vector<std::unique_ptr<agent>> g;
  for (auto& r : results) {
    REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
    g.push_back(std::move(*r));
  }
  CHECK(*g[0]->rpc_sync<int>("w1", "add", 1, 2) == 3);
  CHECK(*g[1]->rpc_sync<int>("w0", "add", 3, 4) == 7);
  std::vector<future<int>> fs;
  for (int i = 0; i < 100; ++i)
    fs.push_back(g[i % 2]->rpc_async<int>(i % 3 ? "w1" : "w0", "add", i, 1));
  auto got = when_all(std::move(fs)).get(std::chrono::seconds(20));
  REQUIRE_MESSAGE(got, (got ? "" : got.error().to_string()));
  for (int i = 0; i < 100; ++i) CHECK((*got)[static_cast<std::size_t>(i)] == i + 1);
  for (int i = 1; i <= 50; ++i) CHECK(g[0]->notify("w1", "tell", i).get(std::chrono::seconds(10)));
  auto d = deadline::after(std::chrono::seconds(10));
  while (told.load() != 1275 && !d.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(told.load() == 1275);
  std::vector<float> v(std::size_t{4} << 20);  // 16 MiB
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 10007) * 0.5f;
  auto big = tensor::from<float>(v, dtype::float32);
  for (int round = 0; round < 2; ++round) {
    auto back = g[round]->rpc_sync<tensor>(round == 0 ? "w1" : "w0", "echo", big);
    REQUIRE_MESSAGE(back, (back ? "" : back.error().to_string()));
    CHECK(same_values(*back, big));
  }
  shutdown_all(g);
}

namespace {

// A lone TLS worker (a static group of one) and the port it accepts TCP on.
struct lone_worker {
  std::shared_ptr<memory_store> s = std::make_shared<memory_store>();
  std::unique_ptr<agent> a;
  std::uint16_t port = 0;
  explicit lone_worker(tls::config identity) {
    auto o = base_options(s);
    o.functions = standard_functions();
    o.local_socket = false;
    o.tls = std::move(identity);
    auto r = init_rpc("w0", 0, 1, o);
    REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
    a = std::move(*r);
    auto rec = s->get("troupe/rpc/static/0", std::chrono::seconds(1));
    REQUIRE(rec);
    auto m = rpc::detail::decode_member(*rec);
    REQUIRE(m);
    port = m->port;
  }
  ~lone_worker() {
    if (a) (void)a->shutdown();
  }
};

// A TCP client on 127.0.0.1 with a 2 s read timeout.
struct tcp_client {
  int fd = -1;
  explicit tcp_client(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~tcp_client() { ::close(fd); }
  void send_all(std::span<const std::byte> b) const {
    while (!b.empty()) {
      auto w = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
      if (w <= 0) return;
      b = b.subspan(static_cast<std::size_t>(w));
    }
  }
  // Some bytes, or none at EOF or after the timeout.
  bytes receive() const {
    bytes out(64 * 1024);
    auto n = ::recv(fd, out.data(), out.size(), 0);
    out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return out;
  }
};

// The opening RPC frame of a plain caller.
bytes plain_hello() {
  wire::frame_builder hs(wire::kind::handshake, 0);
  std::uint32_t protocol = wire::version;
  std::string nonce(16, 'n');
  REQUIRE(serialize(hs.message(), nullptr, protocol, nonce, worker_info{"plain", 3},
                    std::string("troupe/rpc")));
  REQUIRE(hs.finish());
  return hs.head();
}

// Runs a TLS client session over `c` until it fails or the peer goes quiet, sending `say`
// once established. Returns the session's error, if any.
std::optional<error> talk_tls(tcp_client& c, tls::session& s, std::span<const std::byte> say) {
  bool said = false;
  auto fail = [&](error e) {  // our alert goes out, as the agent's would
    std::vector<std::byte> out;
    s.take_output(out);
    c.send_all(out);
    return e;
  };
  for (int rounds = 0; rounds < 50; ++rounds) {
    auto h = s.handshake();
    if (!h) return fail(h.error());
    if (*h && !said) {
      REQUIRE(s.write(say));
      said = true;
    }
    std::vector<std::byte> out;
    s.take_output(out);
    c.send_all(out);
    auto in = c.receive();
    if (in.empty()) return std::nullopt;  // EOF or silence
    s.put_input(in);
    if (s.established()) {
      std::byte buf[4096];
      auto r = s.read(buf);
      if (!r) return fail(r.error());
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("a TLS worker refuses a plain caller, logs its address, and tells it what to set") {
  REQUIRE_PKI();
  log_capture logs;
  lone_worker w(job_identity());
  tcp_client c(w.port);
  c.send_all(plain_hello());
  auto answer = c.receive();
  REQUIRE(answer.size() >= wire::header_size);
  auto h = wire::read_header(std::span<const std::byte>(answer.data(), wire::header_size), {});
  REQUIRE(h);
  CHECK(h->type == wire::kind::error);
  std::string text(reinterpret_cast<const char*>(answer.data()), answer.size());
  CHECK(text.find("requires TLS") != std::string::npos);
  CHECK(text.find("TROUPE_TLS_CERT") != std::string::npos);
  CHECK(c.receive().empty());  // then closed
  CHECK(logs.has({"refused a connection without TLS from 127.0.0.1:", "TROUPE_TLS_CERT"}));
  CHECK(*w.a->rpc_sync<int>("w0", "add", 1, 2) == 3);  // and serves on
}

TEST_CASE("a plain worker refuses a TLS caller and logs that it does not use TLS") {
  REQUIRE_PKI();
  log_capture logs;
  lone_worker w(tls::config{});
  tcp_client c(w.port);
  auto ctx = tls::context::make(job_identity());
  REQUIRE(ctx);
  auto s = tls::session::make(*ctx, true);
  REQUIRE(s);
  auto hello = std::vector<std::byte>{std::byte{1}};
  auto e = talk_tls(c, **s, hello);
  CHECK_FALSE((*s)->established());
  CHECK(logs.has(
      {"refused a TLS connection from 127.0.0.1:", "does not use TLS", "TROUPE_TLS_CERT"}));
}

TEST_CASE(
    "a worker whose certificate another CA signed is refused, and each side says which "
    "certificate") {
  REQUIRE_PKI();
  log_capture logs;
  lone_worker w(job_identity());
  SUBCASE("the stranger trusts the job's CA: the worker refuses its certificate") {
    tcp_client c(w.port);
    auto ctx = tls::context::make({pki()->other_node_cert(), pki()->other_node_key(), pki()->ca()});
    REQUIRE(ctx);
    auto s = tls::session::make(*ctx, true);
    REQUIRE(s);
    auto hello = plain_hello();
    auto e = talk_tls(c, **s, hello);
    REQUIRE(e);
    INFO(e->to_string());
    CHECK(e->code() == errc::unauthorized);
    CHECK(mentions(*e, "the peer refused this worker's certificate"));
    CHECK(mentions(*e, "TROUPE_TLS_CERT"));
    CHECK(logs.has({"from 127.0.0.1:", "not signed by this job's CA", "TROUPE_TLS_CA"}));
  }
  SUBCASE(
      "the stranger trusts only its own CA: it refuses the worker's certificate, and is refused") {
    tcp_client c(w.port);
    auto ctx =
        tls::context::make({pki()->other_node_cert(), pki()->other_node_key(), pki()->other_ca()});
    REQUIRE(ctx);
    auto s = tls::session::make(*ctx, true);
    REQUIRE(s);
    auto hello = plain_hello();
    auto e = talk_tls(c, **s, hello);
    REQUIRE(e);
    INFO(e->to_string());
    CHECK(e->code() == errc::unauthorized);
    CHECK(mentions(*e, "the peer's certificate was refused"));
    auto d = deadline::after(std::chrono::seconds(5));
    while (!logs.has({"from 127.0.0.1:", "refused this worker's certificate"}) && !d.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(logs.has({"from 127.0.0.1:", "refused this worker's certificate"}));
  }
  CHECK(*w.a->rpc_sync<int>("w0", "add", 2, 2) == 4);  // it serves on
}

TEST_CASE("TLS workers whose CAs differ both fail init with an error about certificates") {
  REQUIRE_PKI();
  auto results = start_group(2, [](int r) {
    return r == 0
               ? job_identity()
               : tls::config{pki()->other_node_cert(), pki()->other_node_key(), pki()->other_ca()};
  });
  REQUIRE_FALSE(results[0]);
  REQUIRE_FALSE(results[1]);
  // Whichever fails first stops listening, so the other may only see its port closed.
  bool named = false;
  for (auto& r : results)
    named = named || (r.error().code() == errc::unauthorized && mentions(r.error(), "certificate"));
  CHECK(named);
}

TEST_CASE("missing, unreadable or mismatched TLS files fail init naming the setting and the file") {
  REQUIRE_PKI();
  auto init_with = [](tls::config c) {
    auto o = base_options(std::make_shared<memory_store>());
    o.local_socket = false;
    o.tls = std::move(c);
    return init_rpc("w0", 0, 1, o);
  };
  auto id = job_identity();
  {
    auto a = init_with(tls::config{"/nonexistent/node.pem", id.key, id.ca});
    REQUIRE_FALSE(a);
    INFO(a.error().to_string());
    CHECK(a.error().code() == errc::invalid_argument);
    CHECK(mentions(a.error(), "cannot read TROUPE_TLS_CERT file '/nonexistent/node.pem'"));
    CHECK(mentions(a.error(), "No such file"));
  }
  {
    const std::string junk = pki()->dir() + "/junk.pem";
    std::ofstream(junk) << "not a certificate\n";
    auto a = init_with(tls::config{id.cert, id.key, junk});
    REQUIRE_FALSE(a);
    INFO(a.error().to_string());
    CHECK(mentions(a.error(), "TROUPE_TLS_CA file '" + junk + "' is not PEM"));
  }
  {
    auto a = init_with(tls::config{id.cert, "", ""});
    REQUIRE_FALSE(a);
    INFO(a.error().to_string());
    CHECK(mentions(a.error(), "TROUPE_TLS_KEY"));
  }
  {
    auto a = init_with(tls::config{id.cert, pki()->client_key(), id.ca});
    REQUIRE_FALSE(a);
    INFO(a.error().to_string());
    CHECK(mentions(a.error(), "is not the key of the certificate"));
  }
  {
    // The same files through the environment.
    ::setenv("TROUPE_TLS_CERT", "/nonexistent/env.pem", 1);
    ::setenv("TROUPE_TLS_KEY", id.key.c_str(), 1);
    ::setenv("TROUPE_TLS_CA", id.ca.c_str(), 1);
    auto a = init_with(tls::config{});
    ::unsetenv("TROUPE_TLS_CERT");
    ::unsetenv("TROUPE_TLS_KEY");
    ::unsetenv("TROUPE_TLS_CA");
    REQUIRE_FALSE(a);
    CHECK(mentions(a.error(), "cannot read TROUPE_TLS_CERT file '/nonexistent/env.pem'"));
  }
}
