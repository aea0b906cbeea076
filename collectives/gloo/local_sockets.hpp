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
#pragma once

#include <cstddef>
#include <vector>

namespace troupe::collectives::gloo_sockets {

/// The send buffer requested for same-host connections when TROUPE_GLOO_LOCAL_SNDBUF is
/// not set (the kernel doubles the request for its bookkeeping).
inline constexpr std::size_t default_local_sndbuf = 256 << 10;

/// TROUPE_GLOO_LOCAL_SNDBUF in bytes when set to a number (0: leave the kernel's
/// autotuning alone), else `default_local_sndbuf`.
std::size_t local_sndbuf_from_env();

/// This process's open file descriptors, sorted.
std::vector<int> open_fds();

/// Whether `fd` is a connected TCP socket whose peer is on this host: a loopback peer, or
/// a peer address equal to the socket's own.
bool is_same_host_tcp(int fd);

/// Sets SO_SNDBUF to `bytes` on every descriptor in `after` but not in `before` (both
/// sorted) that is a same-host TCP connection; returns how many were set. `bytes == 0`
/// sets none. Another descriptor opened in the same instant by another part of the
/// program only gets a smaller send buffer if it is a same-host TCP connection.
int size_new_local_send_buffers(const std::vector<int>& before, const std::vector<int>& after,
                                std::size_t bytes);

}  // namespace troupe::collectives::gloo_sockets
