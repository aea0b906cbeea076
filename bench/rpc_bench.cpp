// RPC benchmark: the figures of docs/rpc.md against the physical limit on this machine (a
// raw TCP ping-pong and echo between two processes, measured in the same run).
//   rpc_bench [--iters N] [--seconds S] [--sizes 4096,1048576,...] [--busy-poll-us U] [--inline]
//             [--tcp-only]
// Prints one JSON object per measurement (impl, bench, size, figures) for bench/compare.py.
// --busy-poll-us sets rpc_backend_options::busy_poll (without it, the library's default:
// spinning for up to 50 us while calls are quick; 0 turns it off).
//
// Under a launcher (RANK set: troupe-run, torchrun, or bare RANK/WORLD_SIZE=2/MASTER_ADDR/
// MASTER_PORT), the program is one side of a 2-process job instead of forking its peer, so
// that the two sides can run on different hosts (bench/hosts_bench.sh): troupe::init opens
// the job's store; rank 1 listens for the raw TCP echo on its job address (published in the
// store) and serves RPC; rank 0 drives and prints the roundtrip and echo figures (raw TCP
// and RPC). The membership figures (init, join) are single-host only.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include <troupe/world/world.hpp>
#include "support/child_process.hpp"

using namespace troupe;
using namespace troupe::rpc;

namespace {

using fsec = std::chrono::duration<double>;

struct config {
  int iters = 3000;
  double seconds = 2.0;
  std::vector<std::size_t> sizes{4096, 1 << 20, 16 << 20, 64 << 20};
  int busy_poll_us = -1;  // the library's default
  bool run_inline = false;
  bool tcp_only = false;  // no local sockets: loopback TCP between the workers
  std::string self;
};

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

void emit(const char* impl, const char* bench, const std::string& key, const std::string& figs) {
  std::printf("{\"impl\": \"%s\", \"bench\": \"%s\"%s%s}\n", impl, bench, key.empty() ? "" : ", ",
              (key + (figs.empty() ? "" : ", ") + figs).c_str());
  std::fflush(stdout);
}

// ---------- raw TCP ----------

bool write_all(int fd, const void* p, std::size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    auto w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    auto r = ::recv(fd, b, n, 0);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Echo server on a listening socket: accepts one connection, then reads an 8-byte length
// and that many bytes and echoes both back, until the peer closes; closes both sockets.
void raw_tcp_serve(int ls) {
  int s = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  if (s < 0) return;
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> buf;
  for (;;) {
    std::uint64_t n = 0;
    if (!read_all(s, &n, 8)) break;
    buf.resize(n);
    if (!read_all(s, buf.data(), n) || !write_all(s, &n, 8) || !write_all(s, buf.data(), n)) break;
  }
  ::close(s);
}

void raw_tcp_drive(const config& c, int s);

void raw_tcp(const config& c) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(ls, 1);
  socklen_t len = sizeof a;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  // Forked before any other thread runs; the echo ends when the driver closes its socket.
  auto child = troupe::test::child_process::start_forked([ls] {
    raw_tcp_serve(ls);
    return 0;
  });
  ::close(ls);
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  raw_tcp_drive(c, s);
  child.wait(std::chrono::minutes(1));
}

// The driving side on a connected socket: the ping-pong, then the echo of each size;
// closes the socket.
void raw_tcp_drive(const config& c, int s) {
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto round = [&](std::vector<char>& buf) {
    std::uint64_t n = buf.size();
    write_all(s, &n, 8);
    write_all(s, buf.data(), n);
    read_all(s, &n, 8);
    read_all(s, buf.data(), n);
  };
  std::vector<char> small(64);
  std::vector<double> lat;
  for (int i = 0; i < c.iters + 200; ++i) {
    auto t0 = clock::now();
    round(small);
    if (i >= 200) lat.push_back(fsec(clock::now() - t0).count() * 1e6);
  }
  emit("troupe", "roundtrip", "\"variant\": \"raw_tcp\"",
       strcat("\"p50_us\": ", pct(lat, 0.5), ", \"p99_us\": ", pct(lat, 0.99)));
  for (auto sz : c.sizes) {
    std::vector<char> buf(sz, 'x');
    std::vector<double> gbs;
    int reps = sz >= (16u << 20) ? 8 : 30;
    for (int i = 0; i < reps + 2; ++i) {
      auto t0 = clock::now();
      round(buf);
      if (i >= 2)
        gbs.push_back(2.0 * static_cast<double>(sz) / fsec(clock::now() - t0).count() / 1e9);
    }
    emit("troupe", "echo", strcat("\"variant\": \"raw_tcp\", \"bytes\": ", sz),
         strcat("\"GBps\": ", pct(gbs, 0.5)));
  }
  ::close(s);
}

// ---------- RPC ----------

std::shared_ptr<function_table> bench_functions(bool inline_noop) {
  auto t = std::make_shared<function_table>();
  (void)t->add(
      "noop", [](int x) { return x; }, function_options{inline_noop});
  (void)t->add("echo", [](tensor x) { return x; });
  return t;
}

rpc_backend_options options_for(const std::string& url, const config& c) {
  rpc_backend_options o;
  o.init_method = url;
  o.device_count = 0;
  o.rpc_timeout = std::chrono::seconds(60);
  if (c.busy_poll_us >= 0) o.busy_poll = std::chrono::microseconds(c.busy_poll_us);
  o.local_socket = !c.tcp_only;
  o.functions = bench_functions(c.run_inline);
  return o;
}

// Starts this program with `args` and the transport options of `c`; a child that cannot
// start is reported and ends the benchmark.
troupe::test::child_process spawn(const config& c, const std::vector<std::string>& args) {
  std::vector<std::string> all{c.self};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--busy-poll-us");
  all.push_back(std::to_string(c.busy_poll_us));
  if (c.run_inline) all.push_back("--inline");
  if (c.tcp_only) all.push_back("--tcp-only");
  auto p = troupe::test::child_process::start(all);
  if (!p.started()) {
    std::fprintf(stderr, "could not start %s: %s\n", c.self.c_str(), p.start_error().c_str());
    std::exit(2);
  }
  return p;
}

// A served worker waits at most 300 s for its stop key, then 20 s to shut down.
constexpr auto served_worker_limit = std::chrono::minutes(10);

// Child: join (static: rank/world; dynamic: world "-"), report init time, serve until "stop".
int serve(const config& c, const std::string& url, const std::string& name, int rank,
          const std::string& world) {
  std::optional<int> w;
  if (world != "-") w = std::stoi(world);
  auto s = connect_store(url);
  if (!s) return 2;
  auto t0 = clock::now();
  auto a = init_rpc(name, rank, w, options_for(url, c));
  if (!a) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), a.error().to_string().c_str());
    return 2;
  }
  auto ms = fsec(clock::now() - t0).count() * 1e3;
  (void)(*s)->set(strcat("init_ms/", name), std::to_string(ms));
  std::array<std::string, 1> stop{w ? "stop" : "stop_dynamic"};
  (void)(*s)->wait(stop, std::chrono::seconds(300));
  auto r = (*a)->shutdown(std::chrono::seconds(20));
  return r ? 0 : 3;
}

// The driving side's RPC figures against worker `peer`: no-op roundtrip, pipelined no-op
// calls, tensor echo of each size.
void rpc_drive(const config& c, agent& ag, const std::string& peer) {
  std::vector<double> lat;
  for (int i = 0; i < c.iters + 200; ++i) {
    auto t0 = clock::now();
    auto r = ag.rpc_sync<int>(peer, "noop", i);
    if (!r) std::exit(3);
    if (i >= 200) lat.push_back(fsec(clock::now() - t0).count() * 1e6);
  }
  emit("troupe", "roundtrip", "\"variant\": \"rpc\"",
       strcat("\"p50_us\": ", pct(lat, 0.5), ", \"p99_us\": ", pct(lat, 0.99)));
  // Pipelined: keep 64 calls in flight.
  {
    std::mutex mu;
    std::condition_variable cv;
    std::size_t in_flight = 0, done = 0;
    auto until = clock::now() + fsec(c.seconds);
    auto t0 = clock::now();
    while (clock::now() < until) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return in_flight < 64; });
        ++in_flight;
      }
      ag.rpc_async<int>(peer, "noop", 1).on_complete([&](expected<int>&&) {
        std::lock_guard<std::mutex> lk(mu);
        --in_flight;
        ++done;
        cv.notify_one();
      });
    }
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return in_flight == 0; });
    emit("troupe", "async", "\"in_flight\": 64",
         strcat("\"calls_per_s\": ", static_cast<double>(done) / fsec(clock::now() - t0).count()));
  }
  for (auto sz : c.sizes) {
    auto t = tensor::zeros(dtype::uint8, {static_cast<std::int64_t>(sz)});
    std::vector<double> gbs;
    int reps = sz >= (16u << 20) ? 8 : 30;
    for (int i = 0; i < reps + 2; ++i) {
      auto t0 = clock::now();
      auto r = ag.rpc_sync<tensor>(peer, "echo", t);
      if (!r) std::exit(4);
      if (i >= 2)
        gbs.push_back(2.0 * static_cast<double>(sz) / fsec(clock::now() - t0).count() / 1e9);
    }
    emit("troupe", "echo", strcat("\"variant\": \"rpc\", \"bytes\": ", sz),
         strcat("\"GBps\": ", pct(gbs, 0.5)));
  }
}

void rpc_calls(const config& c, const std::string& url) {
  auto child = spawn(c, {"--serve", url, "w1", "1", "2"});
  auto a = init_rpc("w0", 0, 2, options_for(url, c));
  if (!a) {
    std::fprintf(stderr, "init: %s\n", a.error().to_string().c_str());
    std::exit(2);
  }
  auto& ag = **a;
  rpc_drive(c, ag, "w1");
  auto s = connect_store(url);
  (void)(*s)->set("stop", std::string_view("1"));
  (void)ag.shutdown(std::chrono::seconds(20));
  child.wait(served_worker_limit);
}

double max_init_ms(store& s, const std::vector<std::string>& names) {
  double mx = 0;
  for (auto& n : names) {
    auto v = s.get_string(strcat("init_ms/", n), std::chrono::seconds(60));
    if (v) mx = std::max(mx, std::stod(*v));
  }
  return mx;
}

void membership_figures(const config& c) {
  // Static init of 4 workers: the slowest worker's init_rpc time.
  {
    auto server = tcp_store_server::start({});
    auto url = (*server)->url();
    std::vector<troupe::test::child_process> kids;
    std::vector<std::string> names;
    for (int r = 0; r < 4; ++r) {
      names.push_back("s" + std::to_string(r));
      kids.push_back(spawn(c, {"--serve", url, names.back(), std::to_string(r), "4"}));
    }
    auto s = connect_store(url);
    auto ms = max_init_ms(**s, names);
    (void)(*s)->set("stop", std::string_view("1"));
    for (auto& k : kids) k.wait(served_worker_limit);
    emit("troupe", "init", "\"workers\": 4", strcat("\"init_ms\": ", ms));
  }
  // Dynamic: four members, then a fifth joins (timed) and leaves (timed).
  {
    auto server = tcp_store_server::start({});
    auto url = (*server)->url();
    std::vector<troupe::test::child_process> kids;
    std::vector<std::string> names;
    auto s = connect_store(url);
    for (int r = 0; r < 4; ++r) {
      names.push_back("d" + std::to_string(r));
      kids.push_back(spawn(c, {"--serve", url, names.back(), "0", "-"}));
      max_init_ms(**s, {names.back()});  // one at a time, as a group grows
    }
    auto t0 = clock::now();
    auto a = init_rpc("d4", 0, std::nullopt, options_for(url, c));
    auto join_ms = fsec(clock::now() - t0).count() * 1e3;
    if (!a) {
      std::fprintf(stderr, "join: %s\n", a.error().to_string().c_str());
      std::exit(5);
    }
    t0 = clock::now();
    auto l = (*a)->leave();
    auto leave_ms = fsec(clock::now() - t0).count() * 1e3;
    if (!l) std::fprintf(stderr, "leave: %s\n", l.error().to_string().c_str());
    emit("troupe", "join", "\"workers\": 5",
         strcat("\"join_ms\": ", join_ms, ", \"leave_ms\": ", leave_ms));
    (void)(*s)->set("stop_dynamic", std::string_view("1"));
    for (auto& k : kids) k.wait(served_worker_limit);
  }
}

// One side of a 2-process job under a launcher (see the top of this file). Returns the
// exit status.
int across_hosts(const config& c) {
  using namespace std::chrono_literals;
  init_options io;
  io.timeout = 120s;
  io.rpc = true;
  io.rpc_options = options_for("", c);
  auto w = init(io);
  if (!w) {
    std::fprintf(stderr, "rpc_bench: init: %s\n", w.error().to_string().c_str());
    return 2;
  }
  if (w->size() != 2) {
    std::fprintf(stderr, "rpc_bench: under a launcher, run 2 processes (WORLD_SIZE=2), not %d\n",
                 w->size());
    return 2;
  }
  auto& st = *w->store();
  if (w->rank() == 1) {
    int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (::inet_pton(AF_INET, w->address().c_str(), &a.sin_addr) != 1 ||
        ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0) {
      std::fprintf(stderr, "rpc_bench: cannot listen on %s (an IPv4 address): %s\n",
                   w->address().c_str(), std::strerror(errno));
      return 2;
    }
    socklen_t len = sizeof a;
    ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
    (void)st.set("raw_tcp", strcat(w->address(), ":", ntohs(a.sin_port)));
    raw_tcp_serve(ls);  // until rank 0 closes the connection
    std::array<std::string, 1> stop{"stop"};
    if (auto r = st.wait(stop, 300s); !r)
      std::fprintf(stderr, "rpc_bench: rank 1: %s\n", r.error().to_string().c_str());
  } else {
    auto where = st.get_string("raw_tcp", 60s);
    if (!where) {
      std::fprintf(stderr, "rpc_bench: rank 0: %s\n", where.error().to_string().c_str());
      return 2;
    }
    auto colon = where->rfind(':');
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(where->substr(colon + 1))));
    ::inet_pton(AF_INET, where->substr(0, colon).c_str(), &a.sin_addr);
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      std::fprintf(stderr, "rpc_bench: cannot connect to rank 1's echo at %s: %s\n", where->c_str(),
                   std::strerror(errno));
      return 2;
    }
    raw_tcp_drive(c, s);
    rpc_drive(c, *w->rpc(), "worker1");
    (void)st.set("stop", std::string_view("1"));
  }
  auto r = w->shutdown(60s);
  if (!r) std::fprintf(stderr, "rpc_bench: shutdown: %s\n", r.error().to_string().c_str());
  return r ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  c.self = argv[0];
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--serve" && i + 4 < argc) {
      std::string url = argv[i + 1], name = argv[i + 2], rank = argv[i + 3], world = argv[i + 4];
      for (int j = i + 5; j < argc; ++j) {
        std::string b = argv[j];
        if (b == "--busy-poll-us" && j + 1 < argc) c.busy_poll_us = std::stoi(argv[++j]);
        if (b == "--inline") c.run_inline = true;
        if (b == "--tcp-only") c.tcp_only = true;
      }
      return serve(c, url, name, std::stoi(rank), world);
    }
    if (a == "--iters")
      c.iters = std::stoi(next());
    else if (a == "--seconds")
      c.seconds = std::stod(next());
    else if (a == "--busy-poll-us")
      c.busy_poll_us = std::stoi(next());
    else if (a == "--inline")
      c.run_inline = true;
    else if (a == "--tcp-only")
      c.tcp_only = true;
    else if (a == "--sizes") {
      c.sizes.clear();
      std::string v = next();
      std::size_t p = 0;
      while (p < v.size()) {
        auto e = v.find(',', p);
        c.sizes.push_back(std::stoull(v.substr(p, e == std::string::npos ? v.npos : e - p)));
        if (e == std::string::npos) break;
        p = e + 1;
      }
    }
  }
  const std::string spin =
      c.busy_poll_us >= 0 ? " --busy-poll-us " + std::to_string(c.busy_poll_us) : std::string();
  std::fprintf(stderr, "# rpc_bench --iters %d --seconds %g%s%s\n", c.iters, c.seconds,
               spin.c_str(), c.run_inline ? " --inline" : "");
  if (std::getenv("RANK")) return across_hosts(c);
  raw_tcp(c);
  auto server = tcp_store_server::start({});
  rpc_calls(c, (*server)->url());
  membership_figures(c);
  return 0;
}
