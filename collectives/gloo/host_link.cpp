#include <troupe/collectives/gloo/host_link.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>
#include <vector>

#include <troupe/core/error.hpp>
#include <troupe/core/hmac.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe::collectives::gloo_link {

namespace {

// How long a waiter with nothing to move yields its CPU between attempts before it sleeps
// in poll(): a transfer between hosts arrives in pieces, each soon after the last, and a
// yield hands the CPU at once to whoever can use it (a member of this host, the kernel's
// network work), where each sleep and wake-up costs tens of microseconds. On a CPU of its
// own a yield returns at once, so this is a busy poll for at most this long after the
// last byte moved. Between two simulated hosts (2 x 2 members on 2 CPUs, 5 alternating
// runs) 1 ms took 0.88-0.92x the time of 200 us at 1-4 MiB and the same at 16 MiB; 50 us
// took 1.04-1.06x.
constexpr auto yield_time = std::chrono::microseconds(1000);
// The longest single sleep in poll(), so that a deadline is met within it.
constexpr auto longest_poll = std::chrono::milliseconds(100);

// What precedes every exchange's payload.
struct header {
  std::uint64_t seq;
  std::uint64_t bytes;
};

int poll_ms(clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(
      left.count() + 1, 0, std::chrono::milliseconds(longest_poll).count()));
}

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// Both ends' sockets are made non-blocking and close-on-exec; exchanges also want
// every write on the wire at once.
void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Reads or writes exactly `n` bytes of a blocking exchange at set-up, until `deadline`.
template <class Io>
bool move_all(int fd, std::byte* p, std::size_t n, clock::time_point deadline, short events,
              Io io) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t k = io(fd, p + done, n - done);
    if (k > 0) {
      done += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (clock::now() >= deadline) return false;
    pollfd pfd{fd, events, 0};
    ::poll(&pfd, 1, poll_ms(deadline));
  }
  return true;
}

bool read_all(int fd, std::byte* p, std::size_t n, clock::time_point deadline) {
  return move_all(fd, p, n, deadline, POLLIN,
                  [](int f, std::byte* b, std::size_t k) { return ::recv(f, b, k, 0); });
}

bool write_all(int fd, const std::byte* p, std::size_t n, clock::time_point deadline) {
  return move_all(fd, const_cast<std::byte*>(p), n, deadline, POLLOUT,
                  [](int f, std::byte* b, std::size_t k) { return ::send(f, b, k, MSG_NOSIGNAL); });
}

constexpr std::size_t token_chars = 32;

std::string numeric_host(const sockaddr_storage& a) {
  char buf[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), sizeof a, buf, sizeof buf, nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return "an unknown address";
  return buf;
}

expected<std::unique_ptr<link>> listen_side(store& s, const link_options& o,
                                            clock::time_point deadline);
expected<std::unique_ptr<link>> connect_side(store& s, const link_options& o,
                                             clock::time_point deadline);

}  // namespace

// The two sides of set-up are friends in all but name: they build the link through this.
struct link_access {
  static std::unique_ptr<link> make(int fd, std::string peer) {
    return std::unique_ptr<link>(new link(fd, std::move(peer)));
  }
};

namespace {

expected<std::unique_ptr<link>> listen_side(store& s, const link_options& o,
                                            clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(o.address.c_str(), "0", &hints, &found); rc != 0 || !found)
    return make_error(errc::invalid_argument, "this member's address '", o.address,
                      "' does not resolve (", ::gai_strerror(rc),
                      "); set TROUPE_GLOO_HOST to this host's address");
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> info(found, ::freeaddrinfo);
  fd_guard l{::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
  if (l.fd < 0) return make_error(errc::unavailable, "socket(): ", std::strerror(errno));
  if (::bind(l.fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(l.fd, 4) != 0)
    return make_error(errc::invalid_argument, "cannot listen on ", o.address, ": ",
                      std::strerror(errno), "; set TROUPE_GLOO_HOST to an address of this host");
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const std::string where = numeric_host(bound);
  auto nonce = make_nonce();
  if (!nonce) return std::move(nonce).error();
  const std::string token = to_hex(*nonce);
  TROUPE_TRY(s.set("offer", strcat(where, " ", port, " ", token)));
  // Accept until a connection presents the token; any other is closed.
  while (clock::now() < deadline) {
    pollfd pfd{l.fd, POLLIN, 0};
    if (::poll(&pfd, 1, poll_ms(deadline)) <= 0) continue;
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    fd_guard c{::accept4(l.fd, reinterpret_cast<sockaddr*>(&from), &from_len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK)};
    if (c.fd < 0) continue;
    std::array<std::byte, token_chars> got{};
    const auto hello_deadline = std::min(deadline, clock::now() + std::chrono::seconds(5));
    if (!read_all(c.fd, got.data(), got.size(), hello_deadline)) continue;
    if (!equal_constant_time(got, std::as_bytes(std::span(token.data(), token.size())))) continue;
    no_delay(c.fd);
    return link_access::make(c.release(), strcat(o.peer, " (", numeric_host(from), ")"));
  }
  return make_error(errc::timeout, o.peer, " did not connect to ", where, " port ", port,
                    " within ", format_duration(o.timeout),
                    " (is a firewall between the hosts dropping ports other than the store's?)");
}

expected<std::unique_ptr<link>> connect_side(store& s, const link_options& o,
                                             clock::time_point deadline) {
  const auto wait = std::chrono::duration_cast<duration>(deadline - clock::now());
  auto offer = s.get_string("offer", std::max(wait, duration(0)));
  if (!offer)
    return make_error(offer.error().code(), o.peer,
                      " did not publish its address across hosts: ", offer.error().message());
  const auto a = offer->find(' '), b = offer->rfind(' ');
  if (a == std::string::npos || a == b || offer->size() - b - 1 != token_chars)
    return make_error(errc::protocol_error, o.peer, "'s offer '", *offer, "' is malformed");
  const std::string host = offer->substr(0, a), port = offer->substr(a + 1, b - a - 1),
                    token = offer->substr(b + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0 || !found)
    return make_error(errc::protocol_error, o.peer, "'s address '", host, "' port '", port,
                      "' cannot be used: ", ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> info(found, ::freeaddrinfo);
  std::string last = "no attempt";
  while (clock::now() < deadline) {
    fd_guard c{::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
    if (c.fd < 0) return make_error(errc::unavailable, "socket(): ", std::strerror(errno));
    int rc = ::connect(c.fd, found->ai_addr, found->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{c.fd, POLLOUT, 0};
      while (::poll(&pfd, 1, poll_ms(deadline)) == 0 && clock::now() < deadline) {
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = (pfd.revents & POLLOUT) && err == 0 ? 0 : -1;
      errno = err != 0 ? err : ETIMEDOUT;
    }
    if (rc == 0) {
      if (!write_all(c.fd, reinterpret_cast<const std::byte*>(token.data()), token.size(),
                     deadline))
        return make_error(errc::connection_lost, o.peer, " at ", host, " port ", port,
                          " closed the connection before it was set up");
      no_delay(c.fd);
      return link_access::make(c.release(), strcat(o.peer, " (", host, ")"));
    }
    last = std::strerror(errno);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return make_error(errc::timeout, "cannot connect to ", o.peer, " at ", host, " port ", port,
                    " within ", format_duration(o.timeout), " (last: ", last,
                    "); is a firewall between the hosts dropping ports other than the store's?");
}

}  // namespace

expected<std::unique_ptr<link>> link::open(store& s, const link_options& o) {
  const auto deadline = clock::now() + o.timeout;
  return o.listens ? listen_side(s, o, deadline) : connect_side(s, o, deadline);
}

link::~link() { ::close(fd_); }

void link::abort() noexcept {
  aborted_.store(true);
  ::shutdown(fd_, SHUT_RDWR);
}

void link::close() noexcept {
  closed_.store(true);
  ::shutdown(fd_, SHUT_RDWR);
}

expected<void> link::exchange(std::uint64_t seq, std::span<const std::byte> out,
                              std::span<std::byte> in, clock::time_point deadline) {
  transfer t{this, out, in};
  return exchange_all(seq, std::span(&t, 1), deadline);
}

// One transfer's progress: its header and payload each way.
struct link::progress {
  const transfer* t;
  header mine;
  header theirs{};
  std::size_t sent = 0, got = 0;
  bool checked = false;

  std::size_t send_total() const { return sizeof(header) + t->out.size(); }
  std::size_t recv_total() const { return sizeof(header) + t->in.size(); }
  bool done() const { return sent == send_total() && got == recv_total(); }
};

troupe::error link::failure(errc code, std::string why) const {
  if (aborted_.load())
    return make_error(errc::aborted, "the exchange with ", peer_, " was aborted");
  return troupe::error(code, std::move(why));
}

troupe::error link::broken(int err) const {
  return failure(errc::connection_lost,
                 strcat("the connection to ", peer_,
                        err == 0 ? std::string(" was closed by the peer")
                                 : strcat(" broke: ", std::strerror(err)),
                        closed_.load() ? " (this member's group failed first)" : ""));
}

// Moves what the socket takes and gives now; true when some byte moved.
expected<bool> link::step(progress& p) {
  constexpr std::size_t hsize = sizeof(header);
  const auto& t = *p.t;
  bool moved = false;
  if (p.sent < p.send_total()) {
    iovec v[2];
    std::size_t n = 0;
    if (p.sent < hsize) v[n++] = {reinterpret_cast<std::byte*>(&p.mine) + p.sent, hsize - p.sent};
    const std::size_t body = p.sent < hsize ? 0 : p.sent - hsize;
    v[n++] = {const_cast<std::byte*>(t.out.data()) + body, t.out.size() - body};
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    const ssize_t k = ::sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p.sent += static_cast<std::size_t>(k);
      moved = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return broken(errno);
    }
  }
  if (p.got < p.recv_total()) {
    iovec v[2];
    std::size_t n = 0;
    if (p.got < hsize) v[n++] = {reinterpret_cast<std::byte*>(&p.theirs) + p.got, hsize - p.got};
    const std::size_t body = p.got < hsize ? 0 : p.got - hsize;
    // Only the header until it is checked: a peer at another size must not write `in`.
    if (p.got >= hsize || p.checked) v[n++] = {t.in.data() + body, t.in.size() - body};
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    const ssize_t k = ::recvmsg(fd_, &m, MSG_DONTWAIT);
    if (k > 0) {
      p.got += static_cast<std::size_t>(k);
      moved = true;
    } else if (k == 0) {
      return broken(0);
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return broken(errno);
    }
    if (!p.checked && p.got >= hsize) {
      if (p.theirs.seq != p.mine.seq || p.theirs.bytes != t.in.size())
        return failure(errc::invalid_argument,
                       strcat(peer_, " sent exchange #", p.theirs.seq, " of ", p.theirs.bytes,
                              " bytes where this member is at #", p.mine.seq, " of ", t.in.size(),
                              " bytes: the members disagree on the collective"));
      p.checked = true;
    }
  }
  return moved;
}

expected<void> link::exchange_all(std::uint64_t seq, std::span<const transfer> ts,
                                  clock::time_point deadline) {
  std::vector<progress> ps;
  ps.reserve(ts.size());
  for (const auto& t : ts) ps.push_back(progress{&t, header{seq, t.out.size()}});
  std::vector<pollfd> fds;
  auto last_progress = clock::now();
  for (;;) {
    bool moved = false, all_done = true;
    for (auto& p : ps) {
      if (p.done()) continue;
      auto& l = *p.t->via;
      if (l.aborted_.load()) return l.failure(errc::aborted, "");
      auto r = l.step(p);
      if (!r) return std::move(r).error();
      moved = moved || *r;
      all_done = all_done && p.done();
    }
    if (all_done) return ok();
    if (moved) {
      last_progress = clock::now();
      continue;
    }
    const auto now = clock::now();
    if (now >= deadline) {
      for (auto& p : ps)
        if (!p.done())
          return p.t->via->failure(
              errc::timeout,
              strcat(p.t->via->peer_,
                     " did not complete the exchange across hosts in time: ", "received ", p.got,
                     " of ", p.recv_total(), " bytes, sent ", p.sent, " of ", p.send_total()));
    }
    if (now - last_progress < yield_time) {
      ::sched_yield();
      continue;
    }
    fds.clear();
    for (auto& p : ps)
      if (!p.done())
        fds.push_back(pollfd{p.t->via->fd_,
                             static_cast<short>((p.got < p.recv_total() ? POLLIN : 0) |
                                                (p.sent < p.send_total() ? POLLOUT : 0)),
                             0});
    ::poll(fds.data(), fds.size(), poll_ms(deadline));
  }
}

}  // namespace troupe::collectives::gloo_link
