#include "collectives/gloo/local_sockets.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>

#include "core/log.hpp"

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
    // IPv4-mapped 127.0.0.0/8
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
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

}  // namespace

std::size_t local_sndbuf_from_env() {
  const char* v = std::getenv("TROUPE_GLOO_LOCAL_SNDBUF");
  if (!v || !*v) return default_local_sndbuf;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    TROUPE_LOG(log_level::warn, "collectives", "TROUPE_GLOO_LOCAL_SNDBUF='", v,
               "' is not a byte count; using ", default_local_sndbuf,
               " (set a number of bytes, or 0 for the kernel's autotuning)");
    return default_local_sndbuf;
  }
  return static_cast<std::size_t>(n);
}

std::vector<int> open_fds() {
  std::vector<int> out;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);  // the listing's own descriptor, closed again below
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.' && std::atoi(e->d_name) != own) out.push_back(std::atoi(e->d_name));
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_same_host_tcp(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int type = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
    return false;
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) return false;
  return is_loopback(peer) || same_address(self, peer);
}

int size_new_local_send_buffers(const std::vector<int>& before, const std::vector<int>& after,
                                std::size_t bytes) {
  if (bytes == 0) return 0;
  std::vector<int> fresh;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(fresh));
  const int value = static_cast<int>(std::min<std::size_t>(bytes, 1u << 30));
  int set = 0;
  for (int fd : fresh) {
    if (!is_same_host_tcp(fd)) continue;
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof value) == 0)
      ++set;
    else
      TROUPE_LOG(log_level::debug, "collectives", "could not set the send buffer of socket ", fd);
  }
  return set;
}

}  // namespace troupe::collectives::gloo_sockets
