// The hierarchical path's link across hosts (gloo_link::link): two members as threads of
// one process over 127.0.0.1, meeting through an in-process store.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <troupe/collectives/gloo/host_link.hpp>
#include <troupe/store/memory_store.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::clock;
using troupe::errc;
using troupe::collectives::gloo_link::link;
using troupe::collectives::gloo_link::link_options;
using host_link = troupe::collectives::gloo_link::link;

link_options options(bool listens, troupe::duration timeout = 10s) {
  link_options o;
  o.listens = listens;
  o.address = "127.0.0.1";
  o.peer = listens ? "rank 1 on host 1" : "rank 0 on host 0";
  o.timeout = timeout;
  return o;
}

// Both ends of one link, opened at once.
std::pair<std::unique_ptr<link>, std::unique_ptr<link>> open_pair(troupe::store& s) {
  auto other = std::async(std::launch::async, [&] { return link::open(s, options(false)); });
  auto a = link::open(s, options(true));
  auto b = other.get();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  return {std::move(*a), std::move(*b)};
}

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

}  // namespace

TEST_CASE("two members exchange their bytes both ways, at every size in a row") {
  troupe::memory_store s;
  auto [a, b] = open_pair(s);
  std::uint64_t seq = 0;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{3} << 20, std::size_t{17}}) {
    CAPTURE(n);
    ++seq;
    auto out_a = pattern(n, 1), out_b = pattern(n, 2);
    std::vector<std::byte> in_a(n), in_b(n);
    const auto deadline = clock::now() + 10s;
    auto other =
        std::async(std::launch::async, [&] { return b->exchange(seq, out_b, in_b, deadline); });
    auto ra = a->exchange(seq, out_a, in_a, deadline);
    auto rb = other.get();
    REQUIRE(ra.has_value());
    REQUIRE(rb.has_value());
    CHECK(in_a == out_b);
    CHECK(in_b == out_a);
  }
}

TEST_CASE("three members exchange different amounts with each other at once over their links") {
  // Links of the pairs (0, 1), (0, 2) and (1, 2): ends[i][j] is member i's link to member j.
  troupe::memory_store s01, s02, s12;
  std::unique_ptr<host_link> ends[3][3];
  std::tie(ends[0][1], ends[1][0]) = open_pair(s01);
  std::tie(ends[0][2], ends[2][0]) = open_pair(s02);
  std::tie(ends[1][2], ends[2][1]) = open_pair(s12);
  // Member i sends bytes(i, j) to member j, up to 2 MiB, so that the sockets fill up.
  auto bytes = [](int i, int j) {
    return std::size_t(700'000) * static_cast<std::size_t>(i + 1) +
           10u * static_cast<std::size_t>(j);
  };
  std::vector<std::byte> out[3][3], in[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      if (i != j) {
        out[i][j] = pattern(bytes(i, j), 10 * i + j);
        in[i][j].resize(bytes(j, i));
      }
  const auto deadline = clock::now() + 20s;
  auto run = [&](int i) {
    std::vector<host_link::transfer> ts;
    for (int j = 0; j < 3; ++j)
      if (j != i) ts.push_back(host_link::transfer{ends[i][j].get(), out[i][j], in[i][j]});
    return host_link::exchange_all(7, ts, deadline);
  };
  auto r1 = std::async(std::launch::async, run, 1);
  auto r2 = std::async(std::launch::async, run, 2);
  auto r0 = run(0);
  REQUIRE(r0.has_value());
  REQUIRE(r1.get().has_value());
  REQUIRE(r2.get().has_value());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      if (i != j) {
        CAPTURE(i);
        CAPTURE(j);
        CHECK(in[i][j] == out[j][i]);
      }
}

TEST_CASE("members at different exchanges or sizes both fail naming the peer and the sizes") {
  troupe::memory_store s;
  auto [a, b] = open_pair(s);
  auto out_a = pattern(64, 1), out_b = pattern(128, 2);
  std::vector<std::byte> in_a(64), in_b(128);
  const auto deadline = clock::now() + 10s;
  auto other =
      std::async(std::launch::async, [&] { return b->exchange(1, out_b, in_b, deadline); });
  auto ra = a->exchange(1, out_a, in_a, deadline);
  auto rb = other.get();
  REQUIRE_FALSE(ra.has_value());
  REQUIRE_FALSE(rb.has_value());
  CHECK(ra.error().code() == errc::invalid_argument);
  CHECK(ra.error().message().find("rank 1 on host 1 (127.0.0.1) sent exchange #1 of 128 bytes") !=
        std::string::npos);
  CHECK(rb.error().code() == errc::invalid_argument);
  // Nothing of the longer message landed past the shorter buffer's header check.
  CHECK(in_a == std::vector<std::byte>(64));
}

TEST_CASE("a peer that closes its link fails the waiting member at once with connection_lost") {
  troupe::memory_store s;
  auto [a, b] = open_pair(s);
  std::vector<std::byte> out(1 << 20), in(1 << 20);
  const auto start = clock::now();
  auto closer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    b->close();
  });
  auto r = a->exchange(1, out, in, clock::now() + 20s);
  closer.get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::connection_lost);
  CHECK(r.error().message().find("rank 1 on host 1") != std::string::npos);
  CHECK(clock::now() - start < 5s);
  // The closed side fails too, saying why.
  auto rb = b->exchange(1, out, in, clock::now() + 1s);
  REQUIRE_FALSE(rb.has_value());
  CHECK(rb.error().code() == errc::connection_lost);
}

TEST_CASE("abort ends a waiting exchange with aborted") {
  troupe::memory_store s;
  auto [a, b] = open_pair(s);
  std::vector<std::byte> out(64), in(64);
  auto aborter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    a->abort();
  });
  const auto start = clock::now();
  auto r = a->exchange(1, out, in, clock::now() + 20s);
  aborter.get();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::aborted);
  CHECK(clock::now() - start < 5s);
}

TEST_CASE("an exchange whose peer never answers times out at its deadline naming the peer") {
  troupe::memory_store s;
  auto [a, b] = open_pair(s);
  std::vector<std::byte> out(64), in(64);
  const auto start = clock::now();
  auto r = a->exchange(1, out, in, clock::now() + 300ms);
  const auto took = clock::now() - start;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::timeout);
  CHECK(r.error().message().find("rank 1 on host 1") != std::string::npos);
  CHECK(r.error().message().find("received 0 of") != std::string::npos);
  CHECK(took >= 300ms);
  CHECK(took < 3s);
}

TEST_CASE("a connection without the offer's token is closed and the real peer still connects") {
  troupe::memory_store s;
  auto listener = std::async(std::launch::async, [&] { return link::open(s, options(true)); });
  // A stranger connects first and sends the wrong token.
  auto offer = s.get_string("offer", 10s);
  REQUIRE(offer.has_value());
  const auto a = offer->find(' '), b = offer->rfind(' ');
  const int port = std::stoi(offer->substr(a + 1, b - a - 1));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  const std::string wrong(32, '0');
  REQUIRE(::send(fd, wrong.data(), wrong.size(), MSG_NOSIGNAL) == 32);
  char c = 0;
  CHECK(::recv(fd, &c, 1, 0) == 0);  // closed by the listener
  ::close(fd);
  auto joiner = link::open(s, options(false));
  auto l = listener.get();
  REQUIRE(l.has_value());
  REQUIRE(joiner.has_value());
  std::vector<std::byte> out_a = pattern(10, 1), out_b = pattern(10, 2), in_a(10), in_b(10);
  auto other = std::async(std::launch::async,
                          [&] { return (*joiner)->exchange(1, out_b, in_b, clock::now() + 10s); });
  REQUIRE((*l)->exchange(1, out_a, in_a, clock::now() + 10s).has_value());
  REQUIRE(other.get().has_value());
  CHECK(in_a == out_b);
}

TEST_CASE("a listener nobody connects to fails within its timeout, naming the peer") {
  troupe::memory_store s;
  const auto start = clock::now();
  auto r = link::open(s, options(true, 300ms));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::timeout);
  CHECK(r.error().message().find("rank 1 on host 1 did not connect") != std::string::npos);
  CHECK(clock::now() - start < 3s);
}

TEST_CASE("an address that is not this host's is refused at once, naming TROUPE_GLOO_HOST") {
  troupe::memory_store s;
  auto o = options(true, 300ms);
  o.address = "192.0.2.1";  // TEST-NET-1: bound by no interface here; nothing is sent
  auto r = link::open(s, o);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("TROUPE_GLOO_HOST") != std::string::npos);
}
