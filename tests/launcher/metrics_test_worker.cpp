// A worker for the metrics endpoint's tests. Usage: metrics_test_worker STOP_FILE [--fail-first]
// troupe::init with RPC over gloo, then rounds of: an RPC call to the next rank and an
// allreduce that also carries whether any rank saw STOP_FILE; all ranks leave together
// after the round in which one saw it (or after 60 s), shut down and exit 0.
// --fail-first: rank 1 exits with code 1 before init on the job's first attempt
// (TROUPE_RESTART_COUNT 0), so that troupe-run restarts the workers once.
// Exit codes: 0 ok, 1 the planned failure, 2 init failed, 3 a call or collective failed.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <troupe/collectives/process_group.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/world/world.hpp>

using namespace troupe;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--fail-first")) {
    std::fprintf(stderr, "usage: metrics_test_worker STOP_FILE [--fail-first]\n");
    return 2;
  }
  if (argc == 3) {
    auto env = detect_cluster_env();
    if (env && env->rank == 1 && env->restart_count == 0) {
      std::fprintf(stderr, "rank 1: exiting on the first attempt on purpose\n");
      return 1;
    }
  }
  const std::filesystem::path stop_file = argv[1];
  init_options o;
  o.timeout = std::chrono::seconds(30);
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
  const std::string next = "worker" + std::to_string((rank + 1) % n);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::vector<float> payload(4096, 1.0f);
  for (;;) {
    auto sum = w->rpc()->rpc_sync<int>(next, "add", rank, 1);
    if (!sum || *sum != rank + 1) {
      std::fprintf(stderr, "rank %d: add on %s failed\n", rank, next.c_str());
      return 3;
    }
    if (auto r =
            w->group().allreduce({payload.data(), dtype::float32, payload.size()}).wait(o.timeout);
        !r) {
      std::fprintf(stderr, "rank %d: allreduce: %s\n", rank, r.error().to_string().c_str());
      return 3;
    }
    std::fill(payload.begin(), payload.end(), 1.0f);
    std::int32_t stop =
        std::filesystem::exists(stop_file) || std::chrono::steady_clock::now() > until;
    if (auto r = w->group().allreduce({&stop, dtype::int32, 1}).wait(o.timeout); !r) {
      std::fprintf(stderr, "rank %d: stop allreduce: %s\n", rank, r.error().to_string().c_str());
      return 3;
    }
    if (stop != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // pace the load, not a wait
  }
  if (auto s = w->shutdown(); !s) {
    std::fprintf(stderr, "rank %d: shutdown: %s\n", rank, s.error().to_string().c_str());
    return 3;
  }
  std::printf("rank %d done\n", rank);
  return 0;
}
