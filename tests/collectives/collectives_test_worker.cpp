// A rank process for the multi-process collective tests:
//   collectives_test_worker MODE STORE_URL RANK WORLD
// MODE: ops (every op and dtype), groups (new_group, split, parallel layout), timeout
// (rank 1 skips an allreduce), kill (loop over a large allreduce until the parent kills
// the last rank, then rebuild among the survivors); hier_blocks and hier_interleaved (the
// hierarchical allreduce suite on simulated hosts of two ranks each, placed as
// simulated_host() says) and hier_kill (kill on simulated hosts).
// Exits 0 on success; prints the reason to stderr and exits 1 otherwise.
#include <unistd.h>

#include <iostream>
#include <string>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include "hierarchical_scenarios.hpp"
#include "op_suite.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

int fail(const std::string& what) {
  std::cerr << "collectives_test_worker rank " << ::getenv("TROUPE_TEST_RANK") << ": " << what
            << std::endl;
  return 1;
}

expected<std::shared_ptr<process_group>> world(std::shared_ptr<store> s, int rank, int size,
                                               std::string name = "world") {
  world_options o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(s);
  o.backend = "gloo";
  o.name = std::move(name);
  o.timeout = 20s;
  return init_world(o);
}

int ops(std::shared_ptr<store> s, int rank, int size) {
  auto g = world(s, rank, size);
  if (!g) return fail("init_world: " + g.error().to_string());
  if (auto e = testing::run_op_suite(**g, 10s); !e.empty()) return fail(e);
  return 0;
}

// Sums each rank's world rank + 1 through `g` and checks it against the members' list.
std::string check_sum(process_group* g, const std::vector<int>& members, const char* what) {
  if (!g) return strcat(what, ": not a member but should be");
  if (g->size() != static_cast<int>(members.size()))
    return strcat(what, ": size ", g->size(), " but ", members.size(), " members expected");
  std::int64_t v = g->spec().global_ranks[static_cast<std::size_t>(g->rank())] + 1;
  auto r = g->allreduce(tensor_view{&v, dtype::int64, 1, device::cpu()}, {reduce_op::sum, 10s})
               .wait(15s);
  if (!r) return strcat(what, ": ", r.error().to_string());
  std::int64_t want = 0;
  for (int m : members) want += m + 1;
  if (v != want) return strcat(what, ": sum ", v, " instead of ", want);
  return {};
}

int groups(std::shared_ptr<store> s, int rank, int size) {
  auto g = world(s, rank, size);
  if (!g) return fail("init_world: " + g.error().to_string());
  auto& w = **g;
  // new_group of the even ranks, listed in reverse
  std::vector<int> evens;
  for (int r = size - 1; r >= 0; --r)
    if (r % 2 == 0) evens.push_back(r);
  auto eg = new_group(w, evens);
  if (!eg) return fail("new_group: " + eg.error().to_string());
  if (rank % 2 == 0) {
    if (auto e = check_sum(eg->get(), evens, "even group"); !e.empty()) return fail(e);
    if ((*eg)->rank() !=
        static_cast<int>(std::find(evens.begin(), evens.end(), rank) - evens.begin()))
      return fail("even group: wrong rank order");
  } else if (*eg) {
    return fail("an odd rank got the even group");
  }
  // split by rank % 2, key = -rank (reverse order); rank 3 opts out with a negative color
  int color = rank == 3 ? -1 : rank % 2;
  auto sg = split(w, color, -rank);
  if (!sg) return fail("split: " + sg.error().to_string());
  if (color < 0) {
    if (*sg) return fail("a rank with a negative color got a group");
  } else {
    std::vector<int> members;
    for (int r = size - 1; r >= 0; --r)
      if (r % 2 == color && r != 3) members.push_back(r);
    if (auto e = check_sum(sg->get(), members, "split group"); !e.empty()) return fail(e);
    if ((*sg)->spec().global_ranks != members) return fail("split group: wrong member order");
  }
  // the parallelism layouts the world size allows: (model, pipeline) degrees
  std::vector<std::pair<int, int>> layouts{{1, 1}};
  if (size % 2 == 0) layouts.insert(layouts.end(), {{2, 1}, {1, 2}});
  if (size % 4 == 0) layouts.push_back({2, 2});
  for (auto [model, pipeline] : layouts) {
    parallelism_options po;
    po.model = model;
    po.pipeline = pipeline;
    po.timeout = 20s;
    auto pg = init_parallelism(w, po);
    if (!pg) return fail("init_parallelism: " + pg.error().to_string());
    std::string tag = strcat(" (model ", model, ", pipeline ", pipeline, ")");
    if (auto e = check_sum(pg->model.get(), pg->layout.model_group(rank), "model group");
        !e.empty())
      return fail(e + tag);
    if (auto e = check_sum(pg->pipeline.get(), pg->layout.pipeline_group(rank), "pipeline group");
        !e.empty())
      return fail(e + tag);
    if (auto e = check_sum(pg->data.get(), pg->layout.data_group(rank), "data group"); !e.empty())
      return fail(e + tag);
  }
  // a layout that does not divide the world is refused on every rank, before any group
  parallelism_options too_big;
  too_big.model = size + 1;
  if (auto bad = init_parallelism(w, too_big); bad || bad.error().code() != errc::invalid_argument)
    return fail("a model degree above the world size was accepted");
  // and the world still works after all that
  std::vector<int> everyone;
  for (int r = 0; r < size; ++r) everyone.push_back(r);
  if (auto e = check_sum(&w, everyone, "world"); !e.empty()) return fail(e);
  return 0;
}

int timeout(std::shared_ptr<store> s, int rank, int size) {
  auto g = world(s, rank, size);
  if (!g) return fail("init_world: " + g.error().to_string());
  float x = 1;
  if (rank == 1) {
    // Skip the allreduce; wait until rank 0 has seen its timeout, then leave.
    if (auto r = s->get("timeout-seen", 20s); !r) return fail("rank 0 never reported");
    return 0;
  }
  auto start = clock::now();
  auto r =
      (*g)->allreduce(tensor_view{&x, dtype::float32, 1, device::cpu()}, {reduce_op::sum, 1500ms})
          .wait(10s);
  auto took = clock::now() - start;
  if (rank == 0) (void)s->set("timeout-seen", std::string_view("1"));
  if (r) return fail("the allreduce succeeded without rank 1");
  // The timeout plus room for a loaded machine (CI runs suites in parallel).
  if (took > 4500ms)
    return fail(strcat("the allreduce failed after ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
                       " ms, not within its 1500 ms timeout"));
  const auto& m = r.error().message();
  if (m.find("[1] did not arrive") == std::string::npos || m.find("'world'") == std::string::npos)
    return fail("the error does not name the group and rank 1: " + r.error().to_string());
  // The failure is sticky: the next op fails at once with the same cause.
  auto again = (*g)->barrier({5s}).wait(2s);
  if (again) return fail("the group worked again after failing");
  std::cout << "rank " << rank << " saw: " << r.error().to_string() << std::endl;
  return 0;
}

int kill_test(std::shared_ptr<store> s, int rank, int size) {
  auto g = world(s, rank, size);
  if (!g) return fail("init_world: " + g.error().to_string());
  std::vector<float> big(std::size_t{4} << 20, 1.0f);  // 16 MiB
  const auto op_timeout = 8s;
  if (auto r = s->add("looping", 1, 5s); !r) return fail("add: " + r.error().to_string());
  expected<void> r;
  auto start = clock::now();
  for (int i = 0; i < 100000; ++i) {
    start = clock::now();
    r = (*g)->allreduce(tensor_view::of(std::span(big)), {reduce_op::max, op_timeout})
            .wait(op_timeout + 5s);
    if (!r) break;
  }
  auto took = clock::now() - start;
  if (r) return fail("never failed although the parent kills a rank");
  // Within the op's timeout: a survivor that never hears of the death directly (its
  // transfers to the dead rank still queued in Gloo) fails when the timeout fires, a
  // scheduler tick or so after op_timeout on a loaded machine.
  if (took > op_timeout + 500ms)
    return fail(strcat("the failure took ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms"));
  // The killed rank is among those named; a survivor still busy finishing the previous
  // operation (one behind) may be named beside it.
  const auto& m = r.error().message();
  auto close = m.find("] did not arrive");
  auto open = close == std::string::npos ? close : m.rfind('[', close);
  bool named = false;
  if (open != std::string::npos) {
    std::string list = m.substr(open + 1, close - open - 1) + ",";
    named = strcat(", ", list).find(strcat(" ", size - 1, ",")) != std::string::npos;
  }
  if (!named) return fail("the error does not name the killed rank: " + r.error().to_string());
  std::cout << "rank " << rank << " saw: " << r.error().to_string() << std::endl;
  // Destroy the broken group and build one of the survivors under a fresh prefix.
  g->reset();
  auto epoch = std::make_shared<prefix_store>(s, "epoch1");
  auto g2 = world(epoch, rank, size - 1);
  if (!g2) return fail("rebuilding: " + g2.error().to_string());
  std::vector<float> small(1024, static_cast<float>(rank + 1));
  auto r2 = (*g2)->allreduce(tensor_view::of(std::span(small)), {reduce_op::sum, 10s}).wait(15s);
  if (!r2) return fail("allreduce among the survivors: " + r2.error().to_string());
  float want = static_cast<float>((size - 1) * size / 2);
  if (small[0] != want || small[1023] != want)
    return fail(strcat("survivors' sum ", small[0], " instead of ", want));
  return 0;
}

int hierarchical(std::shared_ptr<store> s, int rank, int size, const std::string& placement) {
  testing::claim_simulated_host(testing::simulated_host(placement, rank));
  // Rank 0's threshold holds for the group: the others' differ on purpose.
  ::setenv("TROUPE_GLOO_HIERARCHICAL_MIN", rank == 0 ? "262144" : "1", 1);
  auto g = world(s, rank, size);
  if (!g) return fail("init_world: " + g.error().to_string());
  if (auto e = testing::run_hierarchical_suite(*s, **g, placement); !e.empty()) return fail(e);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: collectives_test_worker MODE STORE_URL RANK WORLD\n";
    return 2;
  }
  std::string mode = argv[1];
  int rank = std::stoi(argv[3]), size = std::stoi(argv[4]);
  ::setenv("TROUPE_TEST_RANK", argv[3], 1);
  store_options so;
  so.connect_timeout = 10s;
  so.timeout = 20s;
  auto s = connect_store(argv[2], so);
  if (!s) return fail("connect: " + s.error().to_string());
  std::shared_ptr<store> shared(std::move(*s));
  if (mode == "ops") return ops(shared, rank, size);
  if (mode == "groups") return groups(shared, rank, size);
  if (mode == "timeout") return timeout(shared, rank, size);
  if (mode == "kill") return kill_test(shared, rank, size);
  if (mode == "hier_blocks") return hierarchical(shared, rank, size, "blocks");
  if (mode == "hier_interleaved") return hierarchical(shared, rank, size, "interleaved");
  if (mode == "hier_kill") {
    testing::claim_simulated_host(testing::simulated_host("blocks", rank));
    return kill_test(shared, rank, size);
  }
  return fail("unknown mode " + mode);
}
