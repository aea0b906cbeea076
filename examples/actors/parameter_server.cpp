// parameter_server: worker 0 hosts a parameter-server actor; every other worker is a
// trainer that pulls the weights, computes a gradient on its own data and pushes it back
// asynchronously. The server applies updates as they come, with bounded staleness: a
// trainer's pull for step k waits (a parked response promise, nothing blocks) until every
// trainer has pushed at least k - 2 gradients, so no trainer runs far ahead.
//
//   troupe-run --standalone --nproc-per-node 4 parameter_server [--steps N] [--dim D]
//
// Trainer r minimizes 0.5 * |w - c_r|^2 with c_r = (r, r, ..., r); together the trainers
// minimize the sum, whose optimum is the mean of the c_r. At the end the server checks that
// the weights came within 0.1 of it (asynchronous, stale
// gradients keep them moving around the optimum; a decaying step bounds how far) and
// prints the result.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <troupe/actors/node.hpp>
#include <troupe/actors/system.hpp>
#include <troupe/world/world.hpp>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using pull_atom = caf::atom_constant<caf::atom("pull")>;
using push_atom = caf::atom_constant<caf::atom("push")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using wait_atom = caf::atom_constant<caf::atom("wait")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;

using weights = std::vector<float>;

struct server_state {
  weights w;
  float lr = 0.2f;
  int pushes = 0;
  int trainers_left = 0;
  int trainers_missing = 0;
  std::vector<caf::response_promise> waiting;
  std::vector<caf::response_promise> arrived;
  std::map<int, int> pushed;                                  // trainer rank -> gradients applied
  std::vector<std::pair<int, caf::response_promise>> parked;  // (step, pull)
  static constexpr int staleness = 2;

  int slowest() const {
    int m = INT32_MAX;
    for (auto& [r, k] : pushed) m = std::min(m, k);
    return m;
  }
};

caf::behavior parameter_server(caf::stateful_actor<server_state>* self, int dim, int trainers) {
  self->state.w.assign(static_cast<std::size_t>(dim), 0.0f);
  self->state.trainers_left = trainers;
  self->state.trainers_missing = trainers;
  for (int r = 1; r <= trainers; ++r) self->state.pushed[r] = 0;
  return {
      // Trainers start together: each hello is answered once every trainer has said it.
      [self](hello_atom) -> caf::result<bool> {
        auto& s = self->state;
        s.arrived.push_back(self->make_response_promise());
        if (--s.trainers_missing == 0)
          for (auto& rp : s.arrived) rp.deliver(true);
        return caf::delegated<bool>{};
      },
      [self](pull_atom, int step) -> caf::result<weights> {
        auto& s = self->state;
        if (step <= s.slowest() + server_state::staleness) return s.w;
        s.parked.emplace_back(step, self->make_response_promise());
        return caf::delegated<weights>{};
      },
      [self](push_atom, int rank, const weights& g) {
        auto& s = self->state;
        // A decaying step: early pushes move fast, late ones (stale, and all from the
        // slowest trainer) only a little.
        const float lr = s.lr / (1.0f + static_cast<float>(s.pushes) / 50.0f);
        for (std::size_t i = 0; i < s.w.size() && i < g.size(); ++i) s.w[i] -= lr * g[i];
        ++s.pushes;
        ++s.pushed[rank];
        const int limit = s.slowest() + server_state::staleness;
        std::erase_if(s.parked, [&](auto& p) {
          if (p.first > limit) return false;
          p.second.deliver(s.w);
          return true;
        });
      },
      [self](done_atom) {
        auto& s = self->state;
        if (--s.trainers_left == 0)
          for (auto& rp : s.waiting) rp.deliver(s.w, s.pushes);
      },
      [self](wait_atom) -> caf::result<weights, int> {
        auto& s = self->state;
        if (s.trainers_left == 0) return {s.w, s.pushes};
        s.waiting.push_back(self->make_response_promise());
        return caf::delegated<weights, int>{};
      },
  };
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, dim = 16;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--dim" && i + 1 < argc) {
      dim = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: parameter_server [--steps N] [--dim D] (under troupe-run)\n");
      return 2;
    }
  }

  caf::actor_system_config cfg;
  actors::configure(cfg);
  auto types = std::make_shared<actors::message_types>();
  if (auto r = actors::add_message_type<weights>(cfg, *types, "weights"); !r) return 1;
  caf::actor_system sys{cfg};

  // The job from any launcher, with an RPC agent; this worker's node in the actor world.
  init_options o;
  o.rpc = true;
  o.rpc_options.device_count = 0;
  auto job = troupe::init(o);
  if (!job) {
    std::fprintf(stderr, "parameter_server: %s\n", job.error().to_string().c_str());
    return 1;
  }
  const int world = job->size();
  const int rank = job->rank();
  if (world < 2) {
    std::fprintf(stderr, "parameter_server needs at least 2 workers\n");
    return 2;
  }
  auto n = actors::node::make(sys, *job, types);
  if (!n) {
    std::fprintf(stderr, "parameter_server: %s\n", n.error().to_string().c_str());
    return 1;
  }
  int rc = 0;
  caf::scoped_actor self{sys};
  if (rank == 0) {
    auto ps = sys.spawn(parameter_server, dim, world - 1);
    if (auto r = (*n)->publish(ps, "ps"); !r) return 1;
    self->request(ps, 120s, wait_atom::value)
        .receive(
            [&](weights& w, int pushes) {
              // The optimum: the mean of c_r = r over the trainers 1..world-1.
              const float target = static_cast<float>(world) / 2.0f;
              float worst = 0.0f;
              for (float x : w) worst = std::max(worst, std::fabs(x - target));
              std::printf(
                  "parameter_server: %d pushes from %d trainers; weights within %.2g of the "
                  "optimum %.2f\n",
                  pushes, world - 1, static_cast<double>(worst), static_cast<double>(target));
              if (worst > 0.1f) {
                std::printf("parameter_server: did not converge\n");
                rc = 1;
              } else {
                std::printf("parameter_server: converged\n");
              }
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "parameter_server: %s\n", sys.render(e).c_str());
              rc = 1;
            });
  } else {
    auto ps = (*n)->await_actor("worker0/ps", 30s);
    if (!ps) {
      std::fprintf(stderr, "parameter_server: %s\n", ps.error().to_string().c_str());
      rc = 1;
    }
    if (rc == 0)
      self->request(*ps, 30s, hello_atom::value)
          .receive([](bool) {},
                   [&](caf::error& e) {
                     std::fprintf(stderr, "trainer %d: %s\n", rank, sys.render(e).c_str());
                     rc = 1;
                   });
    const float c = static_cast<float>(rank);
    for (int step = 0; step < steps && rc == 0; ++step) {
      weights w;
      self->request(*ps, 30s, pull_atom::value, step)
          .receive([&](weights& got) { w = std::move(got); },
                   [&](caf::error& e) {
                     std::fprintf(stderr, "trainer %d: %s\n", rank, sys.render(e).c_str());
                     rc = 1;
                   });
      for (float& x : w) x -= c;  // the gradient of 0.5 * |w - c|^2
      self->send(*ps, push_atom::value, rank, w);
    }
    if (rc == 0) self->send(*ps, done_atom::value);
  }
  if (auto r = job->shutdown(); !r) {
    std::fprintf(stderr, "parameter_server: shutdown: %s\n", r.error().to_string().c_str());
    rc = rc ? rc : 1;
  }
  (*n)->shutdown();
  return rc;
}
