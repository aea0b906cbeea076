// The send-buffer sizing of the gloo backend's same-host connections, on real sockets.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <troupe/collectives/gloo/local_sockets.hpp>

using namespace troupe::collectives::gloo_sockets;

namespace {

int send_buffer(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  REQUIRE(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &len) == 0);
  return v;
}

// A listening socket on a loopback address (127.0.0.1 unless given; port 0) and a
// connection to it from the same address (bound first, so that its port is reserved at
// bind time), both ends.
struct loopback_pair {
  int listener = -1, client = -1, server = -1;
  explicit loopback_pair(const char* ip = "127.0.0.1") {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, ip, &a.sin_addr) == 1);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(client >= 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr = a.sin_addr;
    REQUIRE(::bind(client, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = ::accept(listener, nullptr, nullptr);
    REQUIRE(server >= 0);
  }
  ~loopback_pair() {
    for (int fd : {listener, client, server})
      if (fd >= 0) ::close(fd);
  }
};

sockaddr_storage v4(const char* ip, std::uint16_t port = 0) {
  sockaddr_storage s{};
  auto* in = reinterpret_cast<sockaddr_in*>(&s);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  REQUIRE(::inet_pton(AF_INET, ip, &in->sin_addr) == 1);
  return s;
}

sockaddr_storage v6(const char* ip) {
  sockaddr_storage s{};
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&s);
  in6->sin6_family = AF_INET6;
  REQUIRE(::inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1);
  return s;
}

sockaddr_storage local_of(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) == 0);
  return s;
}

std::uint16_t port(const sockaddr_storage& s) {
  return ntohs(reinterpret_cast<const sockaddr_in*>(&s)->sin_port);
}

// "fd 7: 127.0.0.1:4242 -> 127.0.0.1:4343" for each connection, IPv4 ones.
std::string describe(const std::vector<connection>& found) {
  std::string out;
  auto text = [](const sockaddr_storage& s) {
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&s)->sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(port(s));
  };
  for (const auto& c : found)
    out += "fd " + std::to_string(c.fd) + ": " + text(c.self) + " -> " + text(c.peer) + "\n";
  return out;
}

}  // namespace

TEST_CASE("a connection stays on this host when its peer is loopback or its own address") {
  CHECK(is_same_host(v4("127.0.0.1"), v4("127.0.0.1")));
  CHECK(is_same_host(v4("10.1.2.3"), v4("127.0.1.1")));
  CHECK(is_same_host(v4("10.1.2.3"), v4("10.1.2.3")));
  CHECK_FALSE(is_same_host(v4("10.1.2.3"), v4("10.1.2.4")));
  CHECK(is_same_host(v6("fe80::1"), v6("::1")));
  CHECK(is_same_host(v6("2001:db8::5"), v6("2001:db8::5")));
  CHECK(is_same_host(v6("2001:db8::5"), v6("::ffff:127.0.0.1")));
  CHECK_FALSE(is_same_host(v6("2001:db8::5"), v6("2001:db8::6")));
  CHECK_FALSE(is_same_host(v4("10.1.2.3"), sockaddr_storage{}));
}

TEST_CASE("connections are found by their local address, both ends, and not the listener") {
  loopback_pair p;
  auto client_local = local_of(p.client), server_local = local_of(p.server);
  auto found = connections_from({client_local});
  REQUIRE(found.size() == 1);
  CHECK(found[0].fd == p.client);
  CHECK(port(found[0].self) == port(client_local));
  CHECK(port(found[0].peer) == port(server_local));
  // The accepted end shares its local address with the listening socket.
  found = connections_from({server_local});
  REQUIRE(found.size() == 1);
  CHECK(found[0].fd == p.server);
  CHECK(port(found[0].peer) == port(client_local));
  CHECK(connections_from({}).empty());
  CHECK(connections_from({v4("127.0.0.1", 1)}).empty());
}

TEST_CASE("same-host connections get the send buffer, others and unlisted ones keep theirs") {
  // On another loopback address, so that no endpoint of it can be one of p's whatever
  // ports the kernel hands out (a loaded run once found a third connection among p's
  // endpoints; the message lists what was found).
  loopback_pair other("127.0.0.2");
  const int other_before = send_buffer(other.client);
  loopback_pair p;
  auto found = connections_from({local_of(p.client), local_of(p.server)});
  REQUIRE_MESSAGE(found.size() == 2, "the client is fd ", p.client, ", the server fd ", p.server,
                  "; found:\n", describe(found));
  const std::size_t bytes = 96 << 10;
  CHECK(size_local_send_buffers(found, bytes) == 2);
  // Linux doubles the request for its bookkeeping; at least the request is granted.
  CHECK(send_buffer(p.client) >= static_cast<int>(bytes));
  CHECK(send_buffer(p.server) >= static_cast<int>(bytes));
  CHECK(send_buffer(p.client) <= static_cast<int>(2 * bytes));
  CHECK(send_buffer(other.client) == other_before);
  // A connection whose peer is another host is left alone.
  connection remote{other.client, v4("10.1.2.3"), v4("10.1.2.4")};
  CHECK(size_local_send_buffers({remote}, bytes) == 0);
  CHECK(send_buffer(other.client) == other_before);
}

TEST_CASE("a send buffer of zero bytes leaves every connection to the kernel's autotuning") {
  loopback_pair p;
  const int initial = send_buffer(p.client);
  CHECK(size_local_send_buffers(connections_from({local_of(p.client)}), 0) == 0);
  CHECK(send_buffer(p.client) == initial);
}

TEST_CASE("TROUPE_GLOO_LOCAL_SNDBUF chooses the send buffer, and a malformed value falls back") {
  const char* saved = std::getenv("TROUPE_GLOO_LOCAL_SNDBUF");
  std::string keep = saved ? saved : "";
  ::unsetenv("TROUPE_GLOO_LOCAL_SNDBUF");
  CHECK(local_sndbuf_from_env() == default_local_sndbuf);
  ::setenv("TROUPE_GLOO_LOCAL_SNDBUF", "131072", 1);
  CHECK(local_sndbuf_from_env() == 131072);
  ::setenv("TROUPE_GLOO_LOCAL_SNDBUF", "0", 1);
  CHECK(local_sndbuf_from_env() == 0);
  ::setenv("TROUPE_GLOO_LOCAL_SNDBUF", "lots", 1);
  CHECK(local_sndbuf_from_env() == default_local_sndbuf);
  if (saved)
    ::setenv("TROUPE_GLOO_LOCAL_SNDBUF", keep.c_str(), 1);
  else
    ::unsetenv("TROUPE_GLOO_LOCAL_SNDBUF");
}
