// A blocking POSIX TCP socket for tests that speak to the server byte by byte.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::testing {

class raw_socket {
 public:
  /// Connects to 127.0.0.1:port; every later receive gives up after 5 s. A positive
  /// `receive_buffer` sets SO_RCVBUF first, so that the kernel holds little for it.
  explicit raw_socket(std::uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~raw_socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_socket(const raw_socket&) = delete;
  raw_socket& operator=(const raw_socket&) = delete;

  bool connected() const { return connected_; }

  bool send(const void* data, std::size_t n) {
    return ::send(fd_, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
  }
  bool send(const std::vector<std::byte>& data) { return send(data.data(), data.size()); }
  bool send(const std::string& data) { return send(data.data(), data.size()); }

  /// True when the server closed the connection (reads end-of-stream or a reset) within
  /// the receive timeout; anything it sent first is skipped.
  bool closed_by_peer() {
    char buf[256];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

  /// Reads exactly n bytes; empty on failure.
  std::vector<std::byte> receive(std::size_t n) {
    std::vector<std::byte> out(n);
    std::size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) return {};
      got += static_cast<std::size_t>(r);
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

}  // namespace troupe::testing
