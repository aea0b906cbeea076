// The send-buffer sizing of the gloo backend's same-host connections, on real sockets.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "collectives/gloo/local_sockets.hpp"

using namespace troupe::collectives::gloo_sockets;

namespace {

int send_buffer(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  REQUIRE(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &len) == 0);
  return v;
}

bool contains(const std::vector<int>& fds, int fd) {
  return std::find(fds.begin(), fds.end(), fd) != fds.end();
}

// A listening socket on 127.0.0.1 (port 0) and a connection to it, both ends.
struct loopback_pair {
  int listener = -1, client = -1, server = -1;
  loopback_pair() {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(client >= 0);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = ::accept(listener, nullptr, nullptr);
    REQUIRE(server >= 0);
  }
  ~loopback_pair() {
    for (int fd : {listener, client, server})
      if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TEST_CASE("only connected TCP sockets to this host count as same-host connections") {
  loopback_pair p;
  CHECK(is_same_host_tcp(p.client));
  CHECK(is_same_host_tcp(p.server));
  CHECK_FALSE(is_same_host_tcp(p.listener));  // no peer
  int unix_pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair) == 0);
  CHECK_FALSE(is_same_host_tcp(unix_pair[0]));
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  CHECK_FALSE(is_same_host_tcp(pipe_fds[0]));
  CHECK_FALSE(is_same_host_tcp(-1));
  for (int fd : {unix_pair[0], unix_pair[1], pipe_fds[0], pipe_fds[1]}) ::close(fd);
}

TEST_CASE("the list of open descriptors holds new sockets and not the listing's own descriptor") {
  auto before = open_fds();
  CHECK(std::is_sorted(before.begin(), before.end()));
  loopback_pair p;
  auto after = open_fds();
  CHECK(contains(after, p.client));
  CHECK(contains(after, p.server));
  CHECK_FALSE(contains(before, p.client));
  // Listing twice in a row gives the same descriptors: the directory's own is left out.
  CHECK(open_fds() == after);
}

TEST_CASE("connections opened between two listings get the send buffer, older ones keep theirs") {
  loopback_pair old;
  const int old_client = send_buffer(old.client);
  auto before = open_fds();
  loopback_pair fresh;
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  auto after = open_fds();
  const std::size_t bytes = 96 << 10;
  CHECK(size_new_local_send_buffers(before, after, bytes) == 2);  // both ends, not the pipe
  // Linux doubles the request for its bookkeeping; at least the request is granted.
  CHECK(send_buffer(fresh.client) >= static_cast<int>(bytes));
  CHECK(send_buffer(fresh.server) >= static_cast<int>(bytes));
  CHECK(send_buffer(fresh.client) <= static_cast<int>(2 * bytes));
  CHECK(send_buffer(old.client) == old_client);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST_CASE("a send buffer of zero bytes leaves every connection to the kernel's autotuning") {
  auto before = open_fds();
  loopback_pair p;
  const int initial = send_buffer(p.client);
  CHECK(size_new_local_send_buffers(before, open_fds(), 0) == 0);
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
