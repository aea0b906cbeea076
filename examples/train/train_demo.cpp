// train_demo: data-parallel training of a small MLP (hand-written forward and backward,
// synthetic data) with DDP over gloo. The shards are deliberately uneven; a Join scope
// per epoch lets the ranks that run out of batches shadow the others. Rank 0 prints the
// loss and throughput per epoch. At the end every rank checks that all ranks hold
// identical weights and that they match a single-process run of the same computation
// within --tolerance; any mismatch exits non-zero. The single-process run sums the ranks'
// gradients in the group's order, so with the default hook the two agree bit for bit at
// any epoch count and world size; the tolerance covers hooks that compress (--hook
// fp16_compress rounds every bucket to 16 bits) and backends that sum in another order.
//
//   troupe-run --standalone --nproc-per-node 4 train_demo [--epochs 5] [--samples 8192]
//              [--hook allreduce|fp16_compress|bf16_compress]
//   troupe-run --standalone --nproc-per-node 4 --failure-policy replace --max-restarts 1
//              train_demo --kill-one        elastic: one worker is killed mid-training and
//                                           replaced while the others train on (elastic_train.hpp)
//   torchrun --no-python --nproc-per-node 4 train_demo     (or srun, or RANK/WORLD_SIZE/...)
//   train_demo                      one process (world size 1), no launcher needed
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <troupe/core/log.hpp>
#include <troupe/training/ddp.hpp>
#include <troupe/world/world.hpp>
#include "elastic_train.hpp"
#include "mlp.hpp"

namespace {

using namespace troupe;
using namespace troupe::collectives;
using namespace std::chrono_literals;

// The settings both modes share (sizes, learning rate, tolerance, timeout; the elastic
// ones), and DDP's comm hook.
struct options : examples::elastic_settings {
  std::string hook = "allreduce";
};

int usage(const std::string& why) {
  std::fprintf(stderr,
               "train_demo: %s\nusage: train_demo [--epochs N] [--samples N] [--batch N] "
               "[--tolerance X] [--hook allreduce|fp16_compress|bf16_compress] [--timeout 30s] "
               "[--kill-one] [--seed N] [--recovery-report]\n(run it under troupe-run --standalone "
               "--nproc-per-node 4 for data-parallel training; add --failure-policy replace "
               "--max-restarts 1 for elastic training, where --kill-one kills a worker mid-run)\n",
               why.c_str());
  return 2;
}

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

int train(const options& o) {
  // Where this worker stands, from any launcher (troupe-run, torchrun, srun) or alone.
  init_options io;
  io.timeout = o.timeout;
  io.backend = "gloo";
  auto w = troupe::init(io);
  if (!w) {
    std::fprintf(stderr, "train_demo: %s\n", w.error().to_string().c_str());
    return 1;
  }
  const int rank = w->rank(), world = w->size();
  set_log_identity("rank " + std::to_string(rank));
  if (w->elastic() != nullptr) {
    // Under troupe-run --failure-policy replace: train on the group that follows the
    // membership, so a dead worker's replacement joins the others' training.
    if (o.hook != "allreduce")
      return fail(rank, "--hook " + o.hook + " is not available in elastic training");
    return examples::train_elastic(*w, o);
  }
  if (o.kill_one)
    return fail(rank,
                "--kill-one needs elastic training: run under troupe-run --failure-policy "
                "replace --max-restarts 1 (TROUPE_ELASTIC=1)");

  const std::uint64_t data_seed = 7, model_seed = 11;
  auto data = examples::make_dataset(o.samples, o.features, o.classes, data_seed);
  // Each rank starts from different weights; DDP gives every rank rank 0's.
  examples::mlp model(o.features, o.hidden, o.classes,
                      model_seed + static_cast<std::uint64_t>(rank));
  training::ddp_options dopt;
  dopt.timeout = o.timeout;
  auto hook = training::find_comm_hook(o.hook);
  if (!hook) return fail(rank, hook.error().to_string());
  dopt.hook = *hook;
  auto ddp = training::ddp::make(w->group_ptr(), model.parameters(), dopt);
  if (!ddp) return fail(rank, ddp.error().to_string());
  auto& d = **ddp;

  auto [begin, end] = examples::shard(o.samples, rank, world);
  if (rank == 0)
    std::printf(
        "training a %d-%d-%d MLP on %d samples with %d worker(s); shard of rank 0: %d "
        "samples, of rank %d: %d (uneven on purpose, Join keeps them in step)\n",
        o.features, o.hidden, o.classes, o.samples, world, end - begin, world - 1,
        examples::shard(o.samples, world - 1, world).second -
            examples::shard(o.samples, world - 1, world).first);
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    auto t0 = std::chrono::steady_clock::now();
    double stats[3] = {0, 0, 0};  // loss sum, batches, samples
    join_options jo;
    jo.timeout = o.timeout;
    auto scope = join::make({&d}, jo);
    if (!scope) return fail(rank, scope.error().to_string());
    auto r = scope->run([&]() -> expected<void> {
      for (int b = begin; b < end; b += o.batch) {
        int e = std::min(end, b + o.batch);
        model.zero_grad();
        expected<void> marked;
        stats[0] += model.train_batch(data, b, e, [&](std::size_t k) {
          if (marked) marked = d.mark_ready(k);
        });
        TROUPE_TRY(marked);
        TROUPE_TRY(d.finish_step());
        model.sgd(o.lr);
        TROUPE_TRY(d.after_optimizer_step());
        stats[1] += 1;
        stats[2] += e - b;
      }
      return ok();
    });
    if (!r) return fail(rank, r.error().to_string());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (auto s = d.reduce({stats, dtype::float64, 3, device::cpu()}, reduce_op::sum); !s)
      return fail(rank, s.error().to_string());
    if (rank == 0)
      std::printf("epoch %d/%d: loss %.4f, %.0f samples/s\n", epoch, o.epochs, stats[0] / stats[1],
                  stats[2] / secs);
    std::fflush(stdout);
  }

  // Every rank holds rank 0's weights, bit for bit...
  auto theirs = d.broadcast_object(model.w, 0);
  if (!theirs) return fail(rank, theirs.error().to_string());
  double differ = std::memcmp(theirs->data(), model.w.data(), model.w.size() * sizeof(float)) != 0;
  if (auto s = d.reduce({&differ, dtype::float64, 1, device::cpu()}, reduce_op::sum); !s)
    return fail(rank, s.error().to_string());
  // ...and they match the same computation done in one process.
  auto ref = examples::reference_training(data, world, o.epochs, o.batch, o.lr, model_seed,
                                          o.features, o.hidden, o.classes);
  double max_diff = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ref[i] - model.w[i])));
  if (differ > 0)
    return fail(rank, strcat(differ, " ranks hold weights that differ from rank 0's"));
  if (!(max_diff <= o.tolerance))
    return fail(rank, strcat("the weights differ from a single-process run by up to ", max_diff,
                             ", above the tolerance ", o.tolerance));
  if (rank == 0)
    std::printf(
        "all %d worker(s) hold identical weights; max |w - w_single_process| = %.2g "
        "(tolerance %.0e): the distributed run matches a single-process run\n",
        world, max_diff, o.tolerance);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto started = std::chrono::system_clock::now();  // for --recovery-report
  options o;
  o.started_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(started.time_since_epoch()).count();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--kill-one" || a == "--recovery-report") {
      (a == "--kill-one" ? o.kill_one : o.recovery_report) = true;
      continue;
    }
    if (i + 1 >= argc) return usage(a + " needs a value");
    std::string v = argv[++i];
    char* endp = nullptr;
    if (a == "--epochs" || a == "--samples" || a == "--batch") {
      long n = std::strtol(v.c_str(), &endp, 10);
      if (*endp != '\0' || n < 1 || n > 10'000'000)
        return usage(a + " takes a whole number >= 1, got '" + v + "'");
      (a == "--epochs" ? o.epochs : a == "--samples" ? o.samples : o.batch) = static_cast<int>(n);
    } else if (a == "--seed") {
      unsigned long long n = std::strtoull(v.c_str(), &endp, 10);
      if (*endp != '\0' || n == 0)
        return usage("--seed takes a whole number >= 1, got '" + v + "'");
      o.seed = n;
    } else if (a == "--tolerance") {
      o.tolerance = std::strtod(v.c_str(), &endp);
      if (*endp != '\0' || !(o.tolerance > 0))
        return usage("--tolerance takes a positive number, got '" + v + "'");
    } else if (a == "--hook") {
      if (auto h = training::find_comm_hook(v); !h) return usage(h.error().message());
      o.hook = v;
    } else if (a == "--timeout") {
      auto t = parse_duration(v);
      if (!t) return usage(t.error().message());
      o.timeout = *t;
    } else {
      return usage("unknown argument '" + a + "'");
    }
  }
  return train(o);
}
