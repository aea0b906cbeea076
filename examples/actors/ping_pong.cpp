// ping_pong: two workers, one actor each side. Worker 1 publishes a "pong" actor; worker 0
// looks it up by name and sends it requests, timing each round trip.
//
//   troupe-run --standalone --nproc-per-node 2 ping_pong [--rounds N]
//
// Each worker joins its job with troupe::init (any launcher: troupe-run, torchrun, srun),
// which starts a static RPC group of two, and attaches its CAF actor system to it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <troupe/actors/node.hpp>
#include <troupe/actors/system.hpp>
#include <troupe/world/world.hpp>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;

caf::behavior pong(caf::event_based_actor*) {
  return {[](ping_atom, std::int64_t n) { return caf::make_message(pong_atom::value, n); }};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 1000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ping_pong [--rounds N] (run under troupe-run with 2 workers)\n");
      return 2;
    }
  }

  caf::actor_system_config cfg;
  actors::configure(cfg);
  auto types = std::make_shared<actors::message_types>();  // atoms and integers are built in
  caf::actor_system sys{cfg};

  // The job from any launcher, with an RPC agent; this worker's node in the actor world.
  init_options o;
  o.rpc = true;
  o.rpc_options.device_count = 0;
  auto w = troupe::init(o);
  if (!w) {
    std::fprintf(stderr, "ping_pong: %s\n", w.error().to_string().c_str());
    return 1;
  }
  if (w->size() != 2) {
    std::fprintf(stderr, "ping_pong needs exactly 2 workers (--nproc-per-node 2)\n");
    return 2;
  }
  auto n = actors::node::make(sys, *w, types);
  if (!n) {
    std::fprintf(stderr, "ping_pong: %s\n", n.error().to_string().c_str());
    return 1;
  }
  int rc = 0;
  if (w->rank() == 1) {
    if (auto r = (*n)->publish(sys.spawn(pong), "pong"); !r) {
      std::fprintf(stderr, "ping_pong: %s\n", r.error().to_string().c_str());
      rc = 1;
    }
  } else {
    auto peer = (*n)->await_actor("worker1/pong", 30s);
    if (!peer) {
      std::fprintf(stderr, "ping_pong: %s\n", peer.error().to_string().c_str());
      rc = 1;
    } else {
      caf::scoped_actor self{sys};
      std::vector<double> us;
      for (std::int64_t i = 0; i < rounds && rc == 0; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        self->request(*peer, 10s, ping_atom::value, i)
            .receive([&](pong_atom, std::int64_t back) { rc = back == i ? 0 : 1; },
                     [&](caf::error& e) {
                       std::fprintf(stderr, "ping_pong: %s\n", sys.render(e).c_str());
                       rc = 1;
                     });
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      if (rc == 0) {
        std::sort(us.begin(), us.end());
        std::printf("ping_pong: %d round trips to worker1/pong, p50 %.1f us, p99 %.1f us\n", rounds,
                    us[us.size() / 2], us[us.size() * 99 / 100]);
      }
    }
  }
  // A static group ends together: the agent's shutdown waits for every worker, so
  // worker 1 keeps serving until worker 0 is done; then the node lets go of CAF.
  if (auto r = w->shutdown(); !r) {
    std::fprintf(stderr, "ping_pong: shutdown: %s\n", r.error().to_string().c_str());
    rc = rc ? rc : 1;
  }
  (*n)->shutdown();
  return rc;
}
