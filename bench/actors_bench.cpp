// Remote actors through troupe, measured exactly as bench/caf_middleman_bench.cpp measures
// CAF's own middleman: two processes on 127.0.0.1, one message type, the sharing scheduler.
//
//   actors_bench [--rounds N] [--messages N] [--payload BYTES] [--json] [--tcp-only]
//
// Figures: request round trip p50/p99 (a request of `bench_message` answered with the same
// message, one at a time) and one-way throughput (N messages sent without waiting, then one
// request whose answer says how many arrived). Side by side with the middleman, alternating:
//   /usr/bin/python3 bench/compare.py --runs 5
//     --troupe "build/release/bench/actors_bench --json"
//     --anchor "build/release/bench/caf_middleman_bench --json"
// The process re-executes itself as the server ("--serve"); both meet through a TCP store
// this process hosts, as a static RPC group of two.
#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <troupe/actors/node.hpp>
#include <troupe/actors/system.hpp>
#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "actor_bench_common.hpp"
#include "support/child_process.hpp"

namespace {

using namespace troupe;
using namespace std::chrono_literals;

using troupe::bench::bench_message;
using troupe::bench::percentile;
using troupe::bench::server_actor;

using options = troupe::bench::bench_options;

bool io_all(int fd, char* p, std::size_t n, bool out) {
  while (n > 0) {
    auto r = out ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// The physical floor of a round trip here: a blocking 64-byte ping-pong between two
// processes over loopback TCP (TCP_NODELAY). Returns the p50 in microseconds, or -1.
double raw_tcp_p50(int rounds) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  int one = 1;
  // The echo calls only async-signal-safe functions: the CAF and RPC threads run here.
  auto child = troupe::test::child_process::start_forked([ls, one] {
    int c = ::accept(ls, nullptr, nullptr);
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[64];
    while (io_all(c, buf, sizeof buf, false) && io_all(c, buf, sizeof buf, true)) {
    }
    return 0;
  });
  ::close(ls);
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char buf[64] = {};
  std::vector<double> us;
  for (int i = 0; i < rounds + 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!io_all(s, buf, sizeof buf, true) || !io_all(s, buf, sizeof buf, false)) break;
    if (i >= 200)
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(s);
  child.wait(std::chrono::minutes(1));  // the echo ends with the connection
  return us.empty() ? -1 : percentile(us, 0.5);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "actors_bench: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  options o = troupe::bench::parse_options(argc, argv, "actors_bench", false);
  const bool is_server = !o.serve.empty();
  std::unique_ptr<tcp_store_server> store;
  troupe::test::child_process server;
  std::string url = o.serve;
  if (!is_server) {
    auto s = tcp_store_server::start({});
    if (!s) die(s.error().to_string());
    store = std::move(*s);
    url = store->url();
    std::vector<std::string> args{"/proc/self/exe", "--serve", url};
    if (o.tcp_only) args.push_back("--tcp-only");
    server = troupe::test::child_process::start(args);
    if (!server.started()) die("could not start the server process: " + server.start_error());
  }

  caf::actor_system_config cfg;
  actors::configure(cfg);
  auto types = std::make_shared<actors::message_types>();
  if (!actors::add_message_type<bench_message>(cfg, *types, "bench_message"))
    die("type registration");
  caf::actor_system sys{cfg};

  rpc::rpc_backend_options ro;
  ro.init_method = url;
  ro.device_count = 0;
  ro.rpc_timeout = 60s;
  ro.local_socket = !o.tcp_only;
  auto a = rpc::init_rpc(is_server ? "server" : "client", is_server ? 1 : 0, 2, ro);
  if (!a) die(a.error().to_string());
  std::shared_ptr<rpc::agent> agent(std::move(*a));
  auto n = actors::node::attach(sys, agent, types);
  if (!n) die(n.error().to_string());

  int rc = 0;
  if (is_server) {
    if (auto r = (*n)->publish(sys.spawn(server_actor), "server"); !r) die(r.error().to_string());
  } else {
    auto remote = (*n)->await_actor("server/server", 30s);
    if (!remote) die(remote.error().to_string());
    auto figures = troupe::bench::measure(sys, *remote, o.rounds, o.messages, o.payload);
    if (!figures) rc = 1;
    if (rc == 0) {
      double p50 = figures->rtt_p50_us, p99 = figures->rtt_p99_us,
             rate = figures->oneway_msgs_per_s;
      double raw = raw_tcp_p50(std::min(o.rounds, 5000));
      if (o.json)
        std::printf(
            "{\"impl\": \"troupe\", \"bench\": \"actors\", \"payload\": %zu, \"rtt_p50_us\": %.2f, "
            "\"rtt_p99_us\": %.2f, \"oneway_msgs_per_s\": %.1f, \"raw_tcp_rtt_p50_us\": %.2f}\n",
            o.payload, p50, p99, rate, raw);
      else
        std::printf(
            "# actors_bench --rounds %d --messages %d --payload %zu\n"
            "request round trip: p50 %.1f us, p99 %.1f us (%d rounds)\n"
            "one-way throughput: %.0f msgs/s (%d messages)\n"
            "raw TCP ping-pong (the floor): p50 %.1f us\n",
            o.rounds, o.messages, o.payload, p50, p99, o.rounds, rate, o.messages, raw);
    }
  }
  // The static group ends together: the server serves until the client is done.
  if (auto r = agent->shutdown(); !r) {
    std::fprintf(stderr, "actors_bench: shutdown: %s\n", r.error().to_string().c_str());
    rc = rc ? rc : 1;
  }
  (*n)->shutdown();
  // The server ends with the group; an hour bounds one that hangs.
  if (server.started() && (!server.wait(std::chrono::hours(1)) || server.exit_code() != 0))
    rc = rc ? rc : 1;
  return rc;
}
