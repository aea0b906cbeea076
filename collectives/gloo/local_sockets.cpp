#include <troupe/collectives/gloo/local_sockets.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <troupe/collectives/settings.hpp>
#include <troupe/core/log.hpp>

namespace troupe::collectives::gloo_sockets {

namespace {

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// Address bytes only (no port); false across families.
bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;
  if (a.ss_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  return false;
}

std::uint16_t port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(&a)->sin_port;
  if (a.ss_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port;
  return 0;
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  return same_ip(a, b) && port_of(a) == port_of(b);
}

// One address field of /proc/net/tcp ("0100007F:A405": the raw 32-bit words of the
// address as the kernel prints them, then the port in host order) or of /proc/net/tcp6
// (four such words).
bool parse_endpoint(const std::string& field, int family, sockaddr_storage& out) {
  auto colon = field.find(':');
  const std::size_t words = family == AF_INET ? 1 : 4;
  if (colon != words * 8) return false;
  std::uint32_t raw[4] = {};
  for (std::size_t i = 0; i < words; ++i)
    raw[i] = static_cast<std::uint32_t>(std::strtoul(field.substr(i * 8, 8).c_str(), nullptr, 16));
  auto port =
      htons(static_cast<std::uint16_t>(std::strtoul(field.c_str() + colon + 1, nullptr, 16)));
  out = {};
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&out);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr.s_addr, &raw[0], 4);
    in->sin_port = port;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out);
    in6->sin6_family = AF_INET6;
    std::memcpy(in6->sin6_addr.s6_addr, raw, 16);
    in6->sin6_port = port;
  }
  return true;
}

// inode -> (self, peer) of the established connections in one /proc/net table whose local
// endpoint is one of `locals`.
void scan_table(const char* path, int family, const std::vector<sockaddr_storage>& locals,
                std::map<unsigned long, connection>& out) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout;
    unsigned long inode = 0;
    if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode))
      continue;
    if (state != "01" || inode == 0) continue;  // TCP_ESTABLISHED only
    connection c;
    if (!parse_endpoint(local, family, c.self) || !parse_endpoint(remote, family, c.peer)) continue;
    for (const auto& l : locals)
      if (same_endpoint(l, c.self)) {
        out[inode] = c;
        break;
      }
  }
}

}  // namespace

std::size_t local_sndbuf_from_env() {
  const auto text = settings::gloo_local_sndbuf.value();
  if (!text) return default_local_sndbuf;
  const char* v = text->c_str();
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    TROUPE_LOG(log_level::warn, "collectives", settings::gloo_local_sndbuf.variable, "='", v,
               "' is not a byte count; using ", default_local_sndbuf,
               " (set a number of bytes, or 0 for the kernel's autotuning)");
    return default_local_sndbuf;
  }
  return static_cast<std::size_t>(n);
}

bool is_same_host(const sockaddr_storage& self, const sockaddr_storage& peer) {
  if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) return false;
  return is_loopback(peer) || same_ip(self, peer);
}

std::vector<connection> connections_from(const std::vector<sockaddr_storage>& locals) {
  std::map<unsigned long, connection> by_inode;
  scan_table("/proc/net/tcp", AF_INET, locals, by_inode);
  scan_table("/proc/net/tcp6", AF_INET6, locals, by_inode);
  std::vector<connection> out;
  if (by_inode.empty()) return out;
  // Only the links are read, so no other descriptor of the process is touched.
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (auto* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[64] = {};
      std::string link = std::string("/proc/self/fd/") + e->d_name;
      auto n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) != 1) continue;
      auto it = by_inode.find(inode);
      if (it == by_inode.end()) continue;
      it->second.fd = std::atoi(e->d_name);
      out.push_back(it->second);
    }
    ::closedir(d);
  }
  return out;
}

int size_local_send_buffers(const std::vector<connection>& conns, std::size_t bytes) {
  if (bytes == 0) return 0;
  const int value = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
  int set = 0;
  for (const auto& c : conns) {
    if (c.fd < 0 || !is_same_host(c.self, c.peer)) continue;
    // The descriptor was found by a directory scan: make sure it still is this connection
    // (another thread may have closed it and opened something else under the number).
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (::getsockname(c.fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0 ||
        ::getpeername(c.fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        !same_endpoint(self, c.self) || !same_endpoint(peer, c.peer))
      continue;
    if (::setsockopt(c.fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof value) == 0)
      ++set;
    else
      TROUPE_LOG(log_level::debug, "collectives", "could not set the send buffer of socket ", c.fd);
  }
  return set;
}

}  // namespace troupe::collectives::gloo_sockets
