// What bench/actors_bench.cpp (troupe) and bench/caf_middleman_bench.cpp (CAF's own
// middleman) share, so that both measure the same thing: the message type, the server
// actor, and the measurement itself.
//
// Round trip: a request of `bench_message` answered with the same message, one at a time,
// after 1000 warm-up rounds; p50 and p99. Throughput: `messages` plain sends without
// waiting, then one request for the server's count (same sender, so it is answered last).
#pragma once

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace troupe::bench {

struct bench_message {
  uint64_t seq = 0;
  std::string body;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, bench_message& x) {
  return f(caf::meta::type_name("bench_message"), x.seq, x.body);
}

using count_atom = caf::atom_constant<caf::atom("count")>;

/// Counts plain sends; echoes (ok, message) requests; answers (count) with the count.
inline caf::behavior server_actor(caf::stateful_actor<uint64_t>* self) {
  self->state = 0;
  return {
      [=](bench_message&) { ++self->state; },
      [=](caf::ok_atom, bench_message& m) -> bench_message { return std::move(m); },
      [=](count_atom) -> uint64_t { return self->state; },
  };
}

/// The command line both programs take. `serve` is set in the server process each starts
/// (a store URL for troupe, "stdout" for the middleman, which reports its port there).
struct bench_options {
  std::string scheduler = "sharing";
  int rounds = 20000;
  int messages = 200000;
  size_t payload = 32;
  bool json = false;
  std::string serve;
  bool tcp_only = false;  // troupe only: loopback TCP instead of the workers' local sockets
};

/// Parses the options of `program`; --scheduler only when `with_scheduler`. Exits with
/// status 2 and the usage on a bad argument.
inline bench_options parse_options(int argc, char** argv, const std::string& program,
                                   bool with_scheduler) {
  auto usage = [&](const std::string& what) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s%s [--rounds N] [--messages N] [--payload BYTES] [--json]\n",
                 program.c_str(), what.c_str(), program.c_str(),
                 with_scheduler ? " [--scheduler sharing|stealing]" : " [--tcp-only]");
    std::exit(2);
  };
  bench_options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--scheduler" && with_scheduler) {
      o.scheduler = value();
      if (o.scheduler != "sharing" && o.scheduler != "stealing")
        usage("--scheduler must be 'sharing' or 'stealing', got '" + o.scheduler + "'");
    } else if (a == "--rounds") {
      o.rounds = std::atoi(value().c_str());
    } else if (a == "--messages") {
      o.messages = std::atoi(value().c_str());
    } else if (a == "--payload") {
      o.payload = static_cast<size_t>(std::atol(value().c_str()));
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--serve") {
      o.serve = value();
    } else if (a == "--tcp-only" && !with_scheduler) {
      o.tcp_only = true;
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (o.rounds < 10 || o.messages < 10) usage("--rounds and --messages must be at least 10");
  return o;
}

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

struct actor_figures {
  double rtt_p50_us = 0;
  double rtt_p99_us = 0;
  double oneway_msgs_per_s = 0;
};

/// Measures against `remote` (a handle to server_actor elsewhere); nullopt after printing
/// why when a request fails or messages go missing.
inline std::optional<actor_figures> measure(caf::actor_system& sys, const caf::actor& remote,
                                            int rounds, int messages, size_t payload) {
  caf::scoped_actor self{sys};
  bench_message msg{0, std::string(payload, 'x')};
  using clock = std::chrono::steady_clock;
  auto round_trip = [&]() -> bool {
    bool ok = false;
    self->request(remote, std::chrono::seconds(10), caf::ok_atom::value, msg)
        .receive([&](bench_message& reply) { ok = reply.seq == msg.seq; },
                 [&](caf::error& e) {
                   std::fprintf(stderr, "request failed: %s\n", sys.render(e).c_str());
                 });
    ++msg.seq;
    return ok;
  };
  for (int i = 0; i < 1000; ++i)
    if (!round_trip()) return std::nullopt;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    auto t0 = clock::now();
    if (!round_trip()) return std::nullopt;
    us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
  }
  bool failed = false;
  uint64_t before = 0, after = 0;
  self->request(remote, std::chrono::seconds(10), count_atom::value)
      .receive([&](uint64_t n) { before = n; }, [&](caf::error&) { failed = true; });
  auto t0 = clock::now();
  for (int i = 0; i < messages; ++i) {
    msg.seq = static_cast<uint64_t>(i);
    self->send(remote, msg);
  }
  self->request(remote, std::chrono::seconds(120), count_atom::value)
      .receive([&](uint64_t n) { after = n; },
               [&](caf::error& e) {
                 std::fprintf(stderr, "count failed: %s\n", sys.render(e).c_str());
                 failed = true;
               });
  double secs = std::chrono::duration<double>(clock::now() - t0).count();
  if (failed) return std::nullopt;
  if (after - before != static_cast<uint64_t>(messages)) {
    std::fprintf(stderr, "the server counted %llu of %d messages\n",
                 static_cast<unsigned long long>(after - before), messages);
    return std::nullopt;
  }
  return actor_figures{percentile(us, 0.50), percentile(us, 0.99), messages / secs};
}

}  // namespace troupe::bench
