// A worker of the traced actors test, started by troupe-run:
//   actors_trace_worker [--repeat N]
// troupe::init with RPC, an actor node publishing "echo" and "counter"; then N times a plain
// send of i to the next rank's counter and a request (ping, i) to its echo, which must
// answer i + 1; finally it asks the counter for what it got, which must be 0..N-1 in order
// (so every send has arrived before the job ends). Exit codes: 0 ok, 2 set-up failed,
// 3 a check failed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <troupe/actors/node.hpp>
#include <troupe/world/world.hpp>
#include "test_types.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;
using namespace std::chrono_literals;

namespace {

int failed(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: check failed: %s\n", rank, what.c_str());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: actors_trace_worker [--repeat N]\n");
      return 2;
    }
  }
  if (repeat < 1) return std::fprintf(stderr, "--repeat needs a positive count\n"), 2;

  caf::actor_system_config cfg;
  configure(cfg);
  auto types = std::make_shared<message_types>();
  register_types(cfg, *types, false);
  caf::actor_system sys{cfg};

  init_options o;
  o.timeout = 30s;
  o.rpc = true;
  o.rpc_options.device_count = 0;
  o.backend = "gloo";
  auto w = init(o);
  if (!w) return std::fprintf(stderr, "init failed: %s\n", w.error().to_string().c_str()), 2;
  const int rank = w->rank(), n = w->size();
  auto nd = node::make(sys, *w, types);
  if (!nd) return std::fprintf(stderr, "node: %s\n", nd.error().to_string().c_str()), 2;
  if (!(*nd)->publish(sys.spawn(echo_actor), "echo") ||
      !(*nd)->publish(sys.spawn(counter_actor), "counter"))
    return failed(rank, "publish");

  const std::string next = "worker" + std::to_string((rank + 1) % n);
  auto echo = (*nd)->await_actor(next + "/echo", 30s);
  auto counter = (*nd)->await_actor(next + "/counter", 30s);
  if (!echo || !counter)
    return failed(rank, "lookup: " + (echo ? counter : echo).error().to_string());

  caf::scoped_actor self{sys};
  int rc = 0;
  for (std::int32_t i = 0; i < repeat && rc == 0; ++i) {
    self->send(*counter, i);
    self->request(*echo, 10s, ping_atom::value, i)
        .receive(
            [&](std::int32_t v) {
              rc = v == i + 1 ? 0 : failed(rank, "echo answered " + std::to_string(v));
            },
            [&](caf::error& e) { rc = failed(rank, "echo: " + sys.render(e)); });
  }
  if (rc == 0) {
    self->request(*counter, 10s, get_atom::value)
        .receive(
            [&](const std::vector<std::int32_t>& got) {
              for (std::int32_t i = 0; i < repeat; ++i)
                if (static_cast<int>(got.size()) != repeat || got[i] != i)
                  rc = failed(rank, "the counter's sends");
            },
            [&](caf::error& e) { rc = failed(rank, "counter: " + sys.render(e)); });
  }
  // Serve the others until every rank is done: the static agent's shutdown waits for all.
  if (auto s = w->shutdown(); !s && rc == 0)
    rc = failed(rank, "shutdown: " + s.error().to_string());
  (*nd)->shutdown();
  if (rc == 0) std::printf("rank %d of %d: ok\n", rank, n);
  return rc;
}
