// The README's RPC snippet as a user copies it, for the restart test:
//   troupe-run --standalone --nproc-per-node 3 --max-restarts 1 readme_snippet_worker
// Rank 1 exits with code 1 before init on attempt 0 (TROUPE_RESTART_COUNT 0), so the job
// completes only if attempt 1 never reads attempt 0's records. Every rank calls "add" on
// every other rank; prints "worker<rank>: ok on attempt <n>" and exits 0 when all passed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <troupe/rpc/backend_registry.hpp>

int main() {
  const char* restart = std::getenv("TROUPE_RESTART_COUNT");
  const char* rank_text = std::getenv("RANK");
  const int rank = rank_text ? std::atoi(rank_text) : 0;
  const int attempt = restart ? std::atoi(restart) : 0;
  if (rank == 1 && attempt == 0) {
    std::fprintf(stderr, "worker1: exiting on attempt 0 on purpose\n");
    return 1;
  }
  // The snippet, as in the README.
  auto fns = std::make_shared<troupe::rpc::function_table>();
  (void)fns->add("add", [](int a, int b) { return a + b; });
  troupe::rpc::rpc_backend_options o;
  o.functions = fns;
  o.init_timeout = std::chrono::seconds(30);
  auto agent = troupe::rpc::init_rpc_from_env(o);
  if (!agent) {
    std::fprintf(stderr, "worker%d: init failed: %s\n", rank, agent.error().to_string().c_str());
    return 2;
  }
  int failures = 0;
  const auto workers = (*agent)->workers();
  for (const auto& w : workers) {
    auto sum = (*agent)->rpc_sync<int>(w.name, "add", rank, 100);
    if (!sum || *sum != rank + 100) {
      std::fprintf(stderr, "worker%d: add on %s failed: %s\n", rank, w.name.c_str(),
                   sum ? "wrong sum" : sum.error().to_string().c_str());
      ++failures;
    }
  }
  const std::string next = "worker" + std::to_string((rank + 1) % static_cast<int>(workers.size()));
  auto later = (*agent)->rpc_async<int>(next, "add", 4, 5);  // troupe::future<int>
  if (auto v = later.get(std::chrono::seconds(30)); !v || *v != 9) {
    std::fprintf(stderr, "worker%d: rpc_async on %s failed\n", rank, next.c_str());
    ++failures;
  }
  if (auto s = (*agent)->shutdown(); !s) {
    std::fprintf(stderr, "worker%d: shutdown: %s\n", rank, s.error().to_string().c_str());
    ++failures;
  }
  if (failures != 0) return 3;
  std::printf("worker%d: ok on attempt %d with %zu workers\n", rank, attempt, workers.size());
  return 0;
}
