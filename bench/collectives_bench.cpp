// Collective throughput in the layout of nccl-tests: for each message size, the time per
// operation, the algorithm bandwidth (bytes / time) and the bus bandwidth (algbw times the
// operation's correction: 2(n-1)/n for allreduce, (n-1)/n for allgather and
// reduce_scatter, 1 for broadcast).
//
//   collectives_bench [--world N] [--backend gloo]
//                     [--ops allreduce,broadcast,allgather,reduce_scatter]
//                     [--min BYTES] [--max BYTES] [--iters N] [--json] [--fresh] [--cold]
//                     [--dtype float32|bfloat16|float16|float64|int32|...] [--shared]
// --json prints one JSON object per measurement, for bench/compare.py against
// bench/collectives_torch_gloo.py (PyTorch's gloo backend, same sizes and iterations).
// --fresh makes every rank rewrite the input of each operation just before it (inside the
// timed loop, as in bench/mpi_collectives_bench --fresh), as a training step hands over
// freshly written gradients or parameters: an input left unchanged between operations
// stays in the readers' caches, which flatters transports that read it in place.
// --cold makes every rank write a buffer larger than the caches (48 MiB) before each
// operation, and the ranks meet in a barrier; only the operation is timed (rank 0's clock,
// from the barrier's end to the operation's end), so its input comes from memory, as in
// a training step that computed much since writing it. Times then include the skew with
// which the ranks leave the barrier.
// --shared allocates every rank's tensors with shared_host_tensor()
// (collectives/shared_host_memory.hpp): the members of one host then copy them between
// one another with plain copies instead of system calls.
// The program starts N copies of itself as ranks on 127.0.0.1 around a TCP store on port 0;
// rank 0 prints the table. CPU tensors only, float32 unless --dtype names another element
// type (sizes stay in bytes). The JSON lines also carry cpu_us, rank 0's process CPU time
// (all threads, user + system) per operation, and the dtype when it is not float32.
//
// Under a launcher (RANK set: troupe-run, torchrun, or bare RANK/WORLD_SIZE/MASTER_ADDR/
// MASTER_PORT), the program is that rank of the launcher's world instead (troupe::init, its
// world group; --world is ignored), so that ranks can run on several hosts
// (bench/hosts_bench.sh). Across hosts the plain "allreduce" takes the gloo backend's
// hierarchical path for large tensors (docs/collectives.md; TROUPE_GLOO_HIERARCHICAL=0
// measures the flat TCP path instead). There the op "allreduce_hier" is also offered, for
// comparison: the two-level prototype composed of public subgroups that preceded the
// backend's path (shared memory within each host, then the ranks with the same local rank
// across hosts on 1/local_size of the tensor each, then an allgather within the host); its
// ranks must be placed host by host (ranks h*LOCAL_WORLD_SIZE.. on host h).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/shared_host_memory.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/world/world.hpp>
#include "rank_processes.hpp"

namespace {

// --fresh: rewrites the first `bytes` of `dst` with the float (i & 7), copied from one of
// eight 4 KiB blocks made once, as mpi_collectives_bench does. A plain loop of 4-byte
// stores ran at half speed in one build and not in the next (where its code fell against
// 64-byte boundaries), which moved the measured time of a 1 MiB allreduce 1.6x.
void rewrite(void* dst, std::size_t bytes, int i) {
  constexpr std::size_t block = 4096;
  static const auto blocks = [] {
    std::vector<float> b(8 * block / sizeof(float));
    for (std::size_t k = 0; k < b.size(); ++k)
      b[k] = static_cast<float>(k / (block / sizeof(float)));
    return b;
  }();
  const auto* from =
      reinterpret_cast<const char*>(blocks.data()) + static_cast<std::size_t>(i & 7) * block;
  auto* to = static_cast<char*>(dst);
  for (std::size_t off = 0; off < bytes; off += block)
    std::memcpy(to + off, from, std::min(block, bytes - off));
}

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

using args = troupe::bench::rank_bench_args;

// A rank's buffer of floats: ordinary memory, or (--shared) a shared host tensor.
class floats {
 public:
  floats(std::size_t n, float value, bool shared) : n_(n) {
    if (shared && n > 0) {
      auto t = shared_host_tensor(dtype::float32, {static_cast<std::int64_t>(n)});
      if (!t) throw troupe::exception(std::move(t).error());
      shared_ = std::move(*t);
      p_ = static_cast<float*>(shared_.data());
    } else {
      plain_.resize(n);
      p_ = plain_.data();
    }
    std::fill(begin(), end(), value);
  }
  float* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  float* begin() const noexcept { return p_; }
  float* end() const noexcept { return p_ + n_; }

 private:
  std::size_t n_;
  std::vector<float> plain_;
  tensor shared_;
  float* p_ = nullptr;
};
using troupe::bench::bus_factor;

// CPU time (user + system) of every thread of this process so far, in microseconds: the
// transport's threads included, a figure that the machine's load disturbs less than time.
double process_cpu_us() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto us = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) * 1e6 + static_cast<double>(tv.tv_usec);
  };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

// The subgroups of allreduce_hier: this host's ranks, and the ranks with this local rank.
struct two_level {
  std::shared_ptr<process_group> local;
  std::shared_ptr<process_group> cross;
  int local_rank = 0;
  int local_size = 1;
};

int run_ops(const args& a, process_group& pg, int rank, int n, const two_level* h = nullptr);

int run_rank(const args& a) {
  store_options so;
  so.timeout = 60s;
  auto s = connect_store(a.store, so);
  if (!s) {
    std::cerr << "rank " << a.rank << ": " << s.error() << "\n";
    return 1;
  }
  world_options wo;
  wo.rank = a.rank;
  wo.size = a.world;
  wo.store = std::shared_ptr<store>(std::move(*s));
  wo.backend = a.backend;
  wo.timeout = 60s;
  auto g = init_world(wo);
  if (!g) {
    std::cerr << "rank " << a.rank << ": " << g.error() << "\n";
    return 1;
  }
  return run_ops(a, **g, a.rank, a.world);
}

// The element type --dtype names, or nullopt after saying why it cannot be used.
std::optional<dtype> bench_dtype(const args& a) {
  for (std::uint8_t raw = 0; is_valid_dtype(raw); ++raw)
    if (const auto t = static_cast<dtype>(raw); to_string(t) == a.dtype && t != dtype::boolean) {
      if (t != dtype::float32 &&
          std::find(a.ops.begin(), a.ops.end(), "allreduce_hier") != a.ops.end()) {
        std::cerr << "allreduce_hier checks float32 sums: run it without --dtype\n";
        return std::nullopt;
      }
      return t;
    }
  std::cerr << "--dtype " << a.dtype << ": not an element type the collectives reduce; use "
            << "float32, float64, float16, bfloat16, int8, uint8, int16, int32 or int64\n";
  return std::nullopt;
}

// Every operation and size on `pg`, this process being `rank` of `n`.
int run_ops(const args& a, process_group& pg, int rank, int n, const two_level* h) {
  for (const auto& op : a.ops)
    if (op == "allreduce_hier" && !h) {
      std::cerr << "allreduce_hier runs only under a launcher with several hosts "
                   "(bench/hosts_bench.sh)\n";
      return 2;
    }
  std::vector<char> evict(a.cold ? std::size_t{48} << 20 : 0);  // --cold
  const dtype type = *bench_dtype(a);                           // checked in main
  const std::size_t es = element_size(type);
  // The first `elems` elements of the type, in a buffer of floats.
  auto view = [&](floats& v, std::size_t elems) {
    return tensor_view{v.data(), type, elems, device::cpu()};
  };
  if (rank == 0 && !a.json)
    std::printf("# world %d, backend %s, %s\n#%12s %12s %10s %12s %10s %10s\n", n,
                a.backend.c_str(), a.dtype.c_str(), "size(B)", "count", "op", "time(us)", "algbw",
                "busbw");
  for (const auto& op : a.ops) {
    for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
      std::size_t count = bytes / es;
      const std::size_t n_floats = (bytes + sizeof(float) - 1) / sizeof(float);
      floats in(n_floats, 1.0f, a.shared),
          out(op == "allgather" || op == "reduce_scatter" ? n_floats : 0, 0.0f, a.shared);
      const std::size_t part = h ? count / static_cast<std::size_t>(h->local_size) : 0;
      floats own(op == "allreduce_hier" ? part : 0, 0.0f, a.shared);
      std::size_t per_rank = count / static_cast<std::size_t>(n);
      auto run = [&]() -> expected<void> {
        if (op == "allreduce")
          return pg.allreduce(view(in, count), {reduce_op::sum, 60s}).wait(70s);
        if (op == "allreduce_hier") {
          auto mine = std::span(in).subspan(part * static_cast<std::size_t>(h->local_rank), part);
          if (auto r = h->local->allreduce(tensor_view::of(std::span(in)), {reduce_op::sum, 60s})
                           .wait(70s);
              !r)
            return r;
          if (auto r = h->cross->allreduce(tensor_view::of(mine), {reduce_op::sum, 60s}).wait(70s);
              !r)
            return r;
          std::copy(mine.begin(), mine.end(), own.begin());
          return h->local
              ->allgather(tensor_view::of(std::span(own)),
                          tensor_view::of(
                              std::span(in).first(part * static_cast<std::size_t>(h->local_size))),
                          {60s})
              .wait(70s);
        }
        if (op == "broadcast") return pg.broadcast(view(in, count), {0, 60s}).wait(70s);
        if (op == "reduce_scatter")  // `bytes` is the input; each rank keeps 1/n of it
          return pg
              .reduce_scatter(view(in, per_rank * static_cast<std::size_t>(n)), view(out, per_rank),
                              {reduce_op::sum, 60s})
              .wait(70s);
        // allgather: `bytes` is the gathered size, as in nccl-tests
        return pg
            .allgather(view(in, per_rank), view(out, per_rank * static_cast<std::size_t>(n)), {60s})
            .wait(70s);
      };
      // Operations of a few microseconds run 500 times: 50 of them last less than one
      // scheduler tick, and one preemption then moved the mean several-fold.
      int iters = a.iters > 0            ? a.iters
                  : bytes <= (64u << 10) ? 500
                  : bytes <= (1u << 20)  ? 50
                  : bytes <= (16u << 20) ? 10
                                         : 4;
      if (op == "allreduce_hier") {  // the composition must sum: every element n
        if (auto r = run(); !r) {
          std::cerr << op << ": " << r.error() << "\n";
          return 1;
        }
        if (auto bad = std::find_if(in.begin(), in.end(),
                                    [&](float v) { return v != static_cast<float>(n); });
            bad != in.end()) {
          std::cerr << op << ": rank " << rank << " has " << *bad << " at element "
                    << (bad - in.begin()) << " of " << count << " where " << n << " was due\n";
          return 1;
        }
        std::fill(in.begin(), in.end(), 1.0f);
      }
      for (int i = 0; i < 3; ++i)
        if (auto r = run(); !r) {
          std::cerr << op << ": " << r.error() << "\n";
          return 1;
        }
      if (auto r = pg.barrier({60s}).wait(70s); !r) return 1;
      // The input each rank hands over (allgather: its block; the others: the buffer).
      const std::size_t input = op == "allgather" ? per_rank : count;
      const double cpu0 = process_cpu_us();
      auto start = clock::now();
      double cold_us = 0;  // --cold: the operations alone
      for (int i = 0; i < iters; ++i) {
        if (a.fresh) rewrite(in.data(), input * es, i);
        clock::time_point op_start;
        if (a.cold) {
          std::fill(evict.begin(), evict.end(), static_cast<char>(i));
          if (auto r = pg.barrier({60s}).wait(70s); !r) return 1;
          op_start = clock::now();
        }
        if (auto r = run(); !r) {
          std::cerr << op << ": " << r.error() << "\n";
          return 1;
        }
        if (a.cold)
          cold_us += std::chrono::duration<double, std::micro>(clock::now() - op_start).count();
      }
      double us =
          a.cold ? cold_us / iters
                 : std::chrono::duration<double, std::micro>(clock::now() - start).count() / iters;
      const double cpu_us = (process_cpu_us() - cpu0) / iters;
      double algbw = static_cast<double>(bytes) / us / 1e3;  // GB/s
      if (rank == 0 && a.json)
        std::printf(
            "{\"impl\": \"troupe-%s\", \"bench\": \"%s\", \"world\": %d, \"bytes\": %zu, "
            "%s\"time_us\": %.2f, \"busbw_GBps\": %.4f, \"cpu_us\": %.1f}\n",
            a.backend.c_str(), op.c_str(), n, bytes,
            type == dtype::float32 ? "" : ("\"dtype\": \"" + a.dtype + "\", ").c_str(), us,
            algbw * bus_factor(op == "allreduce_hier" ? "allreduce" : op, n), cpu_us);
      else if (rank == 0)
        std::printf(" %12zu %12zu %10s %12.1f %10.3f %10.3f\n", bytes, count, op.c_str(), us, algbw,
                    algbw * bus_factor(op, n));
      std::fflush(stdout);
    }
  }
  return 0;
}

// This process as its rank of the launcher's world.
int run_launched(const args& a) {
  init_options io;
  io.timeout = 120s;
  io.backend = a.backend;
  auto w = init(io);
  if (!w) {
    std::cerr << "collectives_bench: init: " << w.error() << "\n";
    return 1;
  }
  two_level h;
  h.local_rank = w->local_rank();
  h.local_size = w->local_size();
  bool hier = std::find(a.ops.begin(), a.ops.end(), "allreduce_hier") != a.ops.end();
  if (hier) {
    subgroup_options so;
    so.timeout = 120s;
    auto local = split(w->group(), w->rank() / h.local_size, w->rank(), so);
    if (!local) {
      std::cerr << "collectives_bench: the group of this host: " << local.error() << "\n";
      return 1;
    }
    auto cross = split(w->group(), h.local_rank, w->rank(), so);
    if (!cross) {
      std::cerr << "collectives_bench: the group across hosts: " << cross.error() << "\n";
      return 1;
    }
    h.local = std::move(*local);
    h.cross = std::move(*cross);
  }
  int rc = run_ops(a, w->group(), w->rank(), w->size(), hier ? &h : nullptr);
  if (auto r = w->shutdown(60s); !r) {
    std::cerr << "collectives_bench: rank " << w->rank() << ": shutdown: " << r.error() << "\n";
    rc = rc ? rc : 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  args defaults;
  auto parsed = troupe::bench::parse_rank_bench_args(argc, argv, defaults, true);
  if (!parsed) return 2;
  const args& a = *parsed;
  if (!bench_dtype(a)) return 2;
  if (a.rank >= 0) return run_rank(a);
  if (std::getenv("RANK")) return run_launched(a);
  return troupe::bench::run_self_as_ranks(argc, argv, a.world);
}
