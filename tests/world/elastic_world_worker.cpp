// A program written as a user would, for troupe::init in an elastic world: run it under
//   troupe-run --failure-policy replace --nproc-per-node N elastic_world_worker
// init (which joins the job's membership because troupe-run set TROUPE_ELASTIC=1), then
// allreduces on the world group of the newest epoch until the world is whole again after
// one death: rank 1 of the first start kills itself with SIGKILL right after init; troupe-run
// replaces it; the replacement joins; every member then allreduces at size N in the epoch
// that has the replacement (N joins + 1 death + 1 replacement = epoch N + 2).
// Prints "worker<RANK>: init rank R of S in epoch E" and, at the end,
// "worker<RANK>: ok, rank R of N in epoch E after G groups". Exit codes: 0 ok, 2 init
// failed, 3 a check failed.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include <troupe/world/world.hpp>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

int check_failed(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "%s: check failed: %s\n", who.c_str(), what.c_str());
  return 3;
}

}  // namespace

int main() {
  init_options o;
  o.timeout = 30s;
  o.backend = "gloo";
  auto w = init(o);
  if (!w) {
    std::fprintf(stderr, "init failed: %s\n", w.error().to_string().c_str());
    return 2;
  }
  const std::string me = "worker" + std::to_string(w->env().rank);
  auto* eg = w->elastic();
  if (eg == nullptr || !w->membership())
    return check_failed(me, "init did not make an elastic world");
  std::printf("%s: init rank %d of %d in epoch %llu\n", me.c_str(), w->rank(), w->size(),
              static_cast<unsigned long long>(eg->current().epoch.number));
  std::fflush(stdout);
  if (w->env().rank == 1 && w->env().restart_count == 0) ::raise(SIGKILL);

  const int n = w->env().world_size;
  const auto last = static_cast<std::uint64_t>(n + 2);
  int groups = 0;
  std::uint64_t built = 0;
  for (int round = 0; round < 200; ++round) {
    auto v = eg->rebuild(30s);
    if (!v) return check_failed(me, "rebuild: " + v.error().to_string());
    if (v->epoch.number != built) {
      built = v->epoch.number;
      ++groups;
    }
    auto& g = *v->group;
    std::vector<float> t(16, 1.0f);
    auto r = g.allreduce({t.data(), dtype::float32, t.size()}).wait(60s);
    if (!r) {
      if (r.error().code() == errc::membership_changed) continue;  // the next epoch's group
      return check_failed(me, "allreduce: " + r.error().to_string());
    }
    for (float x : t)
      if (x != static_cast<float>(g.size()))
        return check_failed(
            me, "allreduce gave " + std::to_string(x) + " at size " + std::to_string(g.size()));
    if (v->epoch.number >= last && g.size() == n) {
      // Everyone got here in this epoch; meet before anyone leaves (a leave is an epoch).
      const std::string done = "test/done/" + std::to_string(v->epoch.number) + "/";
      if (auto s = w->store()->set(done + me, std::string_view("1")); !s)
        return check_failed(me, "store: " + s.error().to_string());
      std::vector<std::string> keys;
      for (const auto& m : v->epoch.members) keys.push_back(done + m.name);
      if (auto met = w->store()->wait(keys, 30s); !met)
        return check_failed(me, "meeting: " + met.error().to_string());
      std::printf("%s: ok, rank %d of %d in epoch %llu after %d groups\n", me.c_str(), g.rank(),
                  g.size(), static_cast<unsigned long long>(v->epoch.number), groups);
      std::fflush(stdout);
      if (auto s = w->shutdown(); !s) return check_failed(me, "shutdown: " + s.error().to_string());
      return 0;
    }
    // Not whole yet: wait for the next epoch (or go round again after a short while).
    (void)eg->wait_for_change(v->epoch.number, 200ms);
  }
  return check_failed(me, "the world never became whole again in 200 rounds");
}
