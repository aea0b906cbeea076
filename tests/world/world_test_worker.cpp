// A program written as a user would, for the troupe::init tests. Under any launcher:
//   world_test_worker [--timeout 30s] [--rank1-fails-first] [--repeat N]
// troupe::init with RPC, an allreduce over every rank, an RPC call to the next rank, a
// key through the world's store, then shutdown. --rank1-fails-first: rank 1 exits with
// code 1 before init on attempt 0 (TROUPE_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT 0).
// Prints "rank R of N: ok under LAUNCHER, attempt A, scope 'S', address X" on success.
// Exit codes: 0 ok, 1 the planned failure, 2 init failed (the error on stderr), 3 a check
// failed. --repeat N: N allreduces and N calls instead of one each (for the trace test).
// Each round also fetches a remote reference owned by the next rank (agent::remote, then
// to_here), so the traced job shows fetches.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <troupe/collectives/process_group.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/world/world.hpp>

using namespace troupe;

namespace {

int check_failed(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: check failed: %s\n", rank, what.c_str());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  init_options o;
  o.timeout = std::chrono::seconds(30);
  bool rank1_fails_first = false;
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--timeout" && i + 1 < argc) {
      auto t = parse_duration(argv[++i]);
      if (!t) return std::fprintf(stderr, "%s\n", t.error().to_string().c_str()), 2;
      o.timeout = *t;
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (a == "--rank1-fails-first") {
      rank1_fails_first = true;
    } else {
      std::fprintf(stderr,
                   "usage: world_test_worker [--timeout 30s] [--rank1-fails-first] [--repeat N]\n");
      return 2;
    }
  }
  if (rank1_fails_first) {
    auto env = detect_cluster_env();
    if (env && env->rank == 1 && env->restart_count == 0) {
      std::fprintf(stderr, "rank 1: exiting on attempt 0 on purpose\n");
      return 1;
    }
  }

  auto fns = std::make_shared<rpc::function_table>();
  (void)fns->add("add", [](int a, int b) { return a + b; });
  o.rpc = true;
  o.rpc_options.functions = fns;
  o.rpc_options.device_count = 0;
  o.backend = "gloo";
  auto w = init(o);
  if (!w) {
    std::fprintf(stderr, "init failed: %s\n", w.error().to_string().c_str());
    return 2;
  }
  const int rank = w->rank(), n = w->size();

  for (int i = 0; i < repeat; ++i) {
    std::vector<float> v(8, static_cast<float>(rank + 1));
    if (auto r = w->group().allreduce({v.data(), dtype::float32, v.size()}).wait(o.timeout); !r)
      return check_failed(rank, "allreduce: " + r.error().to_string());
    for (float x : v)
      if (x != static_cast<float>(n * (n + 1) / 2)) return check_failed(rank, "allreduce sum");

    const std::string next = "worker" + std::to_string((rank + 1) % n);
    auto sum = w->rpc()->rpc_sync<int>(next, "add", rank, 1000);
    if (!sum || *sum != rank + 1000)
      return check_failed(rank,
                          "add on " + next + ": " + (sum ? "wrong sum" : sum.error().to_string()));

    auto held = w->rpc()->remote<int>(next, "add", rank, 2000);
    auto value = held.to_here(o.timeout);
    if (!value || *value != rank + 2000)
      return check_failed(
          rank, "remote add on " + next + ": " + (value ? "wrong sum" : value.error().to_string()));
  }

  if (auto s = w->store()->set("hello/" + std::to_string(rank), "hi"); !s)
    return check_failed(rank, "store set: " + s.error().to_string());
  auto back = w->store()->get_string("hello/" + std::to_string((rank + 1) % n), o.timeout);
  if (!back || *back != "hi") return check_failed(rank, "store get");

  std::printf("rank %d of %d: ok under %s, attempt %d, scope '%s', address %s\n", rank, n,
              std::string(to_string(w->env().kind)).c_str(), w->env().restart_count,
              w->env().store_scope.c_str(), w->address().c_str());
  std::fflush(stdout);
  if (auto s = w->shutdown(); !s) return check_failed(rank, "shutdown: " + s.error().to_string());
  return 0;
}
