// DDP step overhead: the time a training step takes with DDP (gradient buckets
// all-reduced over gloo while the backward pass goes on) minus the time of the same step
// without it, for a model of --params float32 parameters in --layers equal layers.
// The "backward" writes each layer's gradient (a pass over its weights, last layer first)
// and marks it ready, so communication overlaps with the remaining layers as in training.
//
//   ddp_bench [--world 2,4] [--params 25000000] [--layers 5] [--steps 8] [--warmup 2]
//             [--bucket-mb 25] [--compute-passes 1] [--json]
// --compute-passes N makes the backward N passes over each layer, to match the anchor's
// compute time (the overlap window of the communication): 2 matched bench/ddp_torch.py's
// compute-only step at world 2 and 4 on a 2-vCPU VM (bench/RESULTS.md).
// --json prints one JSON object per world size for bench/compare.py against
// bench/ddp_torch.py (PyTorch DDP on gloo, a Linear stack of the same size).
// Ranks are forked by troupe::launch around an embedded TCP store on 127.0.0.1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/core/cluster_env.hpp>
#include <troupe/launcher/launch.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/training/ddp.hpp>

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using clock_type = std::chrono::steady_clock;

struct args {
  std::vector<int> worlds{2, 4};
  std::size_t params = 25'000'000;
  int layers = 5;
  int steps = 8;
  int warmup = 2;
  double bucket_mb = 25;
  int passes = 1;  // passes over each layer per backward: the compute to overlap with
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One layer's share of the backward pass: a read of the weights, a write of the grads.
void backward_layer(const float* w, float* g, std::size_t n, float step, int passes) {
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.5f * w[i] + step;
  for (int p = 1; p < passes; ++p)
    for (std::size_t i = 0; i < n; ++i) g[i] = 0.999f * g[i] + 0.001f * w[i];
}

expected<void> rank_main(const args& a, int world) {
  auto env = detect_cluster_env();
  if (!env) return std::move(env).error();
  store_options so;
  so.timeout = 120s;
  so.connect_timeout = 60s;
  auto st = connect_store(env->store_url, so);
  if (!st) return std::move(st).error();
  world_options wo;
  wo.rank = env->rank;
  wo.size = world;
  wo.store = std::shared_ptr<store>(std::move(*st));
  wo.backend = "gloo";
  wo.name = "ddp_bench";
  wo.timeout = 120s;
  auto g = init_world(wo);
  if (!g) return std::move(g).error();

  std::vector<float> w(a.params, 0.01f), grad(a.params, 0.f);
  std::size_t per = a.params / static_cast<std::size_t>(a.layers);
  std::vector<training::parameter> ps;
  for (int l = 0; l < a.layers; ++l) {
    std::size_t off = per * static_cast<std::size_t>(l);
    std::size_t n = l == a.layers - 1 ? a.params - off : per;
    ps.push_back({"layer" + std::to_string(l), tensor_view::of(std::span(w).subspan(off, n)),
                  tensor_view::of(std::span(grad).subspan(off, n))});
  }
  training::ddp_options o;
  o.timeout = 120s;
  o.bucket_cap_bytes = static_cast<std::size_t>(a.bucket_mb * (1 << 20));
  auto d = training::ddp::make(*g, ps, o);
  if (!d) return std::move(d).error();

  auto step = [&](bool with_ddp, float s) -> expected<void> {
    for (int l = a.layers; l-- > 0;) {
      auto& p = ps[static_cast<std::size_t>(l)];
      backward_layer(static_cast<const float*>(p.value.data), static_cast<float*>(p.grad.data),
                     p.grad.numel, s, a.passes);
      if (with_ddp) TROUPE_TRY((*d)->mark_ready(static_cast<std::size_t>(l)));
    }
    if (with_ddp) TROUPE_TRY((*d)->finish_step());
    return ok();
  };
  // The compute-only and the DDP steps alternate, so that a drift of the machine's speed
  // during the run falls on both alike (as bench/ddp_torch.py's, whose backward took
  // 250-540 ms per step at world 2 from one run to the next on a 2-vCPU VM with glibc's
  // malloc defaults).
  std::vector<double> local, synced;
  TROUPE_TRY((*d)->barrier());
  for (int i = 0; i < a.warmup + a.steps; ++i)
    for (bool with_ddp : {false, true}) {
      auto t0 = clock_type::now();
      TROUPE_TRY(step(with_ddp, static_cast<float>(i)));
      double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      // Each rank's step ends when its own gradients are final; the slowest rank counts.
      TROUPE_TRY((*g)->allreduce({&ms, dtype::float64, 1, device::cpu()}, {reduce_op::max, 120s})
                     .wait(125s));
      if (i >= a.warmup) (with_ddp ? synced : local).push_back(ms);
    }
  if (env->rank == 0) {
    double c = median(local), s = median(synced);
    if (a.json)
      std::printf(
          "{\"impl\": \"troupe\", \"bench\": \"ddp_step\", \"world\": %d, \"params\": %zu, "
          "\"compute_ms\": %.3f, \"ddp_ms\": %.3f, \"overhead_ms\": %.3f}\n",
          world, a.params, c, s, s - c);
    else
      std::printf(
          "world %d, %zu params in %d layers, %zu buckets: compute-only %.1f ms, with DDP "
          "%.1f ms, overhead %.1f ms per step (median of %d)\n",
          world, a.params, a.layers, (*d)->bucket_plans().size(), c, s, s - c, a.steps);
    std::fflush(stdout);
  }
  return ok();
}

int usage(const std::string& why) {
  std::fprintf(stderr,
               "ddp_bench: %s\nusage: ddp_bench [--world 2,4] [--params N] [--layers N] "
               "[--steps N] [--warmup N] [--bucket-mb 25] [--compute-passes 1] [--json]\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--json") {
      a.json = true;
      continue;
    }
    if (i + 1 >= argc) return usage(k + " needs a value");
    std::string v = argv[++i];
    try {
      if (k == "--world") {
        a.worlds.clear();
        std::stringstream in(v);
        for (std::string item; std::getline(in, item, ',');) a.worlds.push_back(std::stoi(item));
      } else if (k == "--params") {
        a.params = std::stoul(v);
      } else if (k == "--compute-passes") {
        a.passes = std::stoi(v);
      } else if (k == "--bucket-mb") {
        a.bucket_mb = std::stod(v);
      } else if (k == "--layers") {
        a.layers = std::stoi(v);
      } else if (k == "--steps") {
        a.steps = std::stoi(v);
      } else if (k == "--warmup") {
        a.warmup = std::stoi(v);
      } else {
        return usage("unknown argument '" + k + "'");
      }
    } catch (const std::exception&) {
      return usage(k + " takes a number, got '" + v + "'");
    }
  }
  if (a.layers < 1 || a.params < static_cast<std::size_t>(a.layers) || a.steps < 1 ||
      a.passes < 1 || !(a.bucket_mb > 0))
    return usage(
        "need --layers >= 1, --params >= layers, --steps >= 1, --compute-passes >= 1 "
        "and --bucket-mb > 0");
  if (!a.json) {
    std::printf("# ddp_bench");
    for (int i = 1; i < argc; ++i) std::printf(" %s", argv[i]);
    std::printf("\n");
    std::fflush(stdout);  // before the ranks are forked
  }
  for (int world : a.worlds) {
    if (world < 1) return usage("world sizes must be >= 1");
    launch_config lc;
    lc.nprocs = world;
    auto r = launch([&] { return rank_main(a, world); }, lc);
    if (!r) {
      std::fprintf(stderr, "ddp_bench: world %d: %s\n", world, r.error().to_string().c_str());
      return 1;
    }
  }
  return 0;
}
