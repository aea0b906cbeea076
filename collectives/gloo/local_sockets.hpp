// Send-buffer sizing for the TCP connections Gloo opens between ranks on the same host.
// Internal to collectives/gloo.
//
// Gloo's TCP pairs keep the kernel's send-buffer autotuning, which lets a loopback
// connection queue up to net.ipv4.tcp_wmem's maximum (4 MiB by default) of socket
// buffers. Between two processes on one host those bytes are written by one copy and read
// by another moments later; with megabytes in flight per connection they have left the
// caches in between, and both copies run from memory. A send buffer of a few hundred KiB
// keeps them in cache (measured in bench/RESULTS.md). Connections to other hosts keep
// the autotuning, which their bandwidth-delay product may need.
//
// Gloo does not expose its sockets, only each pair's local address. The connections are
// found by that address in /proc/net/tcp{,6} and by their inode among /proc/self/fd's
// links, so that no other descriptor of the process is touched.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <vector>

namespace troupe::collectives::gloo_sockets {

/// The send buffer requested for same-host connections when TROUPE_GLOO_LOCAL_SNDBUF is
/// not set (the kernel doubles the request for its bookkeeping).
inline constexpr std::size_t default_local_sndbuf = 256 << 10;

/// TROUPE_GLOO_LOCAL_SNDBUF in bytes when set to a number (0: leave the kernel's
/// autotuning alone), else `default_local_sndbuf` (a malformed value is logged).
std::size_t local_sndbuf_from_env();

/// Whether a connection from `self` to `peer` (IPv4 or IPv6) stays on this host: the peer
/// is a loopback address, or the same address as `self`.
bool is_same_host(const sockaddr_storage& self, const sockaddr_storage& peer);

/// An established TCP connection of this process.
struct connection {
  int fd = -1;
  sockaddr_storage self{};
  sockaddr_storage peer{};
};

/// This process's established TCP connections whose local address (address and port) is
/// one of `locals`. Empty when /proc is not readable.
std::vector<connection> connections_from(const std::vector<sockaddr_storage>& locals);

/// Sets SO_SNDBUF to `bytes` on those of `conns` that stay on this host; returns how many
/// were set. `bytes == 0` sets none.
int size_local_send_buffers(const std::vector<connection>& conns, std::size_t bytes);

}  // namespace troupe::collectives::gloo_sockets
