// store_bench: throughput and wake-up latency of troupe's TCP store, measured exactly as
// bench/store_c10d.py measures PyTorch's c10d TCPStore (run both with bench/store_compare.sh).
//
//   ops   N client processes, each running set(key, 64 B) + get(key) on its own key for a
//         fixed time; total operations per second.
//   ops_nowait  the same loop with set_nowait, whose set gets no reply (as c10d's set).
//   wake  N client processes block in get() on one key; a setter process writes the key
//         with its monotonic clock (CLOCK_MONOTONIC, as Python's time.monotonic_ns) in the
//         value; each waiter records now - t_set. p50/p99 in microseconds.
//
// Usage: store_bench [--clients 1,8,32] [--seconds 2] [--rounds 200] [--io-threads N]
//                    [--tcp-only]   (the server opens no local socket: clients use TCP)
// Clients are this binary re-executed with --role; they meet through the store itself.
// With TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA set, the server and the clients
// speak TLS over TCP (with --tcp-only: the local socket stays plain); bench/tls_bench.sh.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

namespace {

using namespace troupe;
using namespace std::chrono_literals;

struct args {
  std::string role = "main";
  std::vector<int> clients{1, 8, 32};
  double seconds = 2.0;
  int rounds = 200;
  int port = 0;
  int index = 0;
  int n = 0;
  int io_threads = 0;     // the server's; 0: its default
  bool tcp_only = false;  // no local socket: every client on loopback TCP
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "store_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T check(expected<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + k);
      return argv[++i];
    };
    if (k == "--role")
      a.role = next();
    else if (k == "--seconds")
      a.seconds = std::stod(next());
    else if (k == "--rounds")
      a.rounds = std::stoi(next());
    else if (k == "--port")
      a.port = std::stoi(next());
    else if (k == "--index")
      a.index = std::stoi(next());
    else if (k == "--n")
      a.n = std::stoi(next());
    else if (k == "--io-threads")
      a.io_threads = std::stoi(next());
    else if (k == "--tcp-only")
      a.tcp_only = true;
    else if (k == "--clients") {
      a.clients.clear();
      std::string v = next();
      for (std::size_t p = 0; p < v.size();) {
        auto c = v.find(',', p);
        a.clients.push_back(std::stoi(v.substr(p, c - p)));
        p = c == std::string::npos ? v.size() : c + 1;
      }
    } else
      die("unknown argument " + k + " (see the comment at the top of store_bench.cpp)");
  }
  return a;
}

std::unique_ptr<tcp_store> client(int port) {
  tcp_store_options o;
  o.port = static_cast<std::uint16_t>(port);
  o.tls = tls_config_from_env();
  o.connect_timeout = 30s;
  o.timeout = 60s;
  return check(tcp_store::connect(o), "connect");
}

std::int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Every client announces itself, then waits for the main process's "go".
void start_line(store& s, const std::string& tag, int index) {
  check(s.set(tag + "/ready" + std::to_string(index), std::string_view("1")), "set ready");
  std::vector<std::string> go{tag + "/go"};
  check(s.wait(go, 60s), "wait go");
}

// `nowait`: set_nowait (no reply, c10d's set semantics) instead of set.
void run_ops_client(const args& a, bool nowait) {
  auto s = client(a.port);
  std::string tag = (nowait ? "opsq" : "ops") + std::to_string(a.n);
  std::string key = tag + "/k" + std::to_string(a.index);
  std::vector<std::byte> value(64, std::byte{'x'});
  start_line(*s, tag, a.index);
  long n = 0;
  auto end = clock::now() +
             std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(a.seconds));
  while (clock::now() < end) {
    if (nowait)
      check(s->set_nowait(key, value, 10s), "set_nowait");
    else
      check(s->set(key, value, 10s), "set");
    (void)check(s->get(key, 10s), "get");
    n += 2;
  }
  check(s->set(tag + "/result" + std::to_string(a.index), std::to_string(n)), "set result");
}

void run_wake_waiter(const args& a) {
  auto s = client(a.port);
  std::string tag = "wake" + std::to_string(a.n);
  start_line(*s, tag, a.index);
  std::string lat;
  for (int r = 0; r < a.rounds; ++r) {
    auto v = check(s->get_string(tag + "/r" + std::to_string(r), 60s), "get");
    lat += std::to_string(mono_ns() - std::stoll(v)) + ",";
  }
  check(s->set(tag + "/result" + std::to_string(a.index), lat), "set result");
}

void run_wake_setter(const args& a) {
  auto s = client(a.port);
  std::string tag = "wake" + std::to_string(a.n);
  start_line(*s, tag, a.index);
  for (int r = 0; r < a.rounds; ++r) {
    std::this_thread::sleep_for(2ms);  // let the waiters block in get() for this round
    check(s->set(tag + "/r" + std::to_string(r), std::to_string(mono_ns())), "set");
  }
}

using troupe::test::child_process;

child_process spawn(const std::vector<std::string>& argv) {
  auto p = child_process::start(argv);
  if (!p.started()) die("cannot start a client process: " + p.start_error());
  return p;
}

// Waits for every client (an hour bounds one that hangs); dies unless each exited with 0.
void reap(std::vector<child_process>& clients) {
  for (auto& p : clients)
    if (!p.wait(std::chrono::hours(1)) || p.exit_code() != 0) die("a client process failed");
}

std::vector<child_process> start_clients(const args& a, const std::string& role, int first,
                                         int count, int n) {
  std::vector<child_process> pids;
  for (int i = first; i < first + count; ++i)
    pids.push_back(spawn({"/proc/self/exe", "--role", role, "--port", std::to_string(a.port),
                          "--index", std::to_string(i), "--n", std::to_string(n), "--seconds",
                          std::to_string(a.seconds), "--rounds", std::to_string(a.rounds)}));
  return pids;
}

// Waits until `count` clients are connected and ready, then starts them all at once.
void release(store& s, const std::string& tag, int count) {
  std::vector<std::string> ready;
  for (int i = 0; i < count; ++i) ready.push_back(tag + "/ready" + std::to_string(i));
  check(s.wait(ready, 60s), "wait for clients");
  check(s.set(tag + "/go", std::string_view("1")), "set go");
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

int run_main(args a) {
  tcp_store_server_options so;
  so.io_threads = static_cast<std::size_t>(a.io_threads);
  so.local_socket = !a.tcp_only;
  so.tls = tls_config_from_env();
  auto server = check(tcp_store_server::start(so), "start server");
  a.port = server->port();
  auto s = client(a.port);
  for (int n : a.clients) {
    for (bool nowait : {false, true}) {
      std::string tag = (nowait ? "opsq" : "ops") + std::to_string(n);
      auto pids = start_clients(a, nowait ? "ops-nowait" : "ops", 0, n, n);
      release(*s, tag, n);
      reap(pids);
      long total = 0;
      for (int i = 0; i < n; ++i)
        total += std::stol(check(s->get_string(tag + "/result" + std::to_string(i)), "result"));
      std::printf(
          "{\"impl\": \"troupe\", \"bench\": \"%s\", \"clients\": %d, \"ops_per_s\": %.1f}\n",
          nowait ? "ops_nowait" : "ops", n, static_cast<double>(total) / a.seconds);
      std::fflush(stdout);
    }
    {
      std::string tag = "wake" + std::to_string(n);
      auto pids = start_clients(a, "wake-waiter", 0, n, n);
      auto setter = start_clients(a, "wake-setter", n, 1, n);
      release(*s, tag, n + 1);
      reap(pids);
      reap(setter);
      std::vector<double> lat;
      for (int i = 0; i < n; ++i) {
        auto text = check(s->get_string(tag + "/result" + std::to_string(i)), "result");
        for (std::size_t p = 0; p < text.size();) {
          auto c = text.find(',', p);
          lat.push_back(std::stod(text.substr(p, c - p)) / 1e3);
          p = c + 1;
        }
      }
      std::printf(
          "{\"impl\": \"troupe\", \"bench\": \"wake\", \"clients\": %d, \"p50_us\": %.1f, "
          "\"p99_us\": %.1f}\n",
          n, percentile(lat, 0.5), percentile(lat, 0.99));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a = parse(argc, argv);
  if (a.role == "main") return run_main(a);
  if (a.role == "ops")
    run_ops_client(a, false);
  else if (a.role == "ops-nowait")
    run_ops_client(a, true);
  else if (a.role == "wake-waiter")
    run_wake_waiter(a);
  else if (a.role == "wake-setter")
    run_wake_setter(a);
  else
    die("unknown role " + a.role);
  return 0;
}
