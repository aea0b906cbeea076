// Our nccl process group against raw NCCL calls, in one program, on the same communicator
// sizes, buffers and stream: the cost the wrapper adds (events for stream ordering, the
// watchdog's bookkeeping, work handles).
//
//   nccl_bench [--world N] [--ops allreduce,broadcast,allgather] [--min BYTES] [--max BYTES]
//              [--iters N] [--json]
//
// For each size, both sides enqueue `iters` operations on one stream and wait once at the
// end (as nccl-tests does); the table shows time per op, algbw and busbw for raw NCCL and
// for troupe, and the difference. One rank per GPU (NCCL 2.28 refuses two ranks on one GPU):
// the program starts N copies of itself around a TCP store; rank r uses device r.
// Without a GPU it says so and exits with status 0 after printing nothing but the reason.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/store/connect.hpp>
#include "rank_processes.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using clock_type = std::chrono::steady_clock;

using args = troupe::bench::rank_bench_args;
using troupe::bench::bus_factor;

[[noreturn]] void die(int rank, const std::string& what) {
  std::cerr << "nccl_bench rank " << rank << ": " << what << "\n";
  std::exit(1);
}

void check_cuda(int rank, cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(rank, std::string(what) + ": " + cudaGetErrorString(e));
}
void check_nccl(int rank, ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(rank, std::string(what) + ": " + ncclGetErrorString(r));
}

int run_rank(const args& a) {
  int devices = 0;
  check_cuda(a.rank, cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices <= a.rank)
    die(a.rank, "needs one GPU per rank; this machine has " + std::to_string(devices));
  check_cuda(a.rank, cudaSetDevice(a.rank), "cudaSetDevice");

  store_options so;
  so.timeout = 60s;
  auto s = connect_store(a.store, so);
  if (!s) die(a.rank, s.error().to_string());
  std::shared_ptr<store> st(std::move(*s));

  // Raw NCCL: communicators of our own, their unique ids through the same store.
  auto shared_id = [&](const std::string& key) {
    ncclUniqueId id{};
    if (a.rank == 0) {
      check_nccl(a.rank, ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::vector<std::byte> v(sizeof id);
      std::memcpy(v.data(), &id, sizeof id);
      if (auto r = st->set(key, v); !r) die(a.rank, r.error().to_string());
    } else {
      auto v = st->get(key, 60s);
      if (!v || v->size() != sizeof id) die(a.rank, "could not fetch the raw NCCL id " + key);
      std::memcpy(&id, v->data(), sizeof id);
    }
    return id;
  };
  ncclComm_t raw = nullptr;
  check_nccl(a.rank, ncclCommInitRank(&raw, a.world, shared_id("bench/raw_id"), a.rank),
             "ncclCommInitRank");
  // A second raw communicator in NCCL's non-blocking mode, the mode our group runs in (it is
  // what lets a timeout abort the communicator): the difference between the two raw columns
  // is NCCL's own, the rest is ours.
  const ncclUniqueId nb_id = shared_id("bench/raw_nb_id");
  ncclComm_t raw_nb = nullptr;
  ncclConfig_t nb_cfg = NCCL_CONFIG_INITIALIZER;
  nb_cfg.blocking = 0;
  // Non-blocking: a call may answer ncclInProgress; poll until the communicator is ready.
  auto settle = [&](ncclResult_t r, const char* what) {
    if (r == ncclInProgress) {
      ncclResult_t async = ncclInProgress;
      const auto until = clock_type::now() + 60s;
      while (async == ncclInProgress && clock_type::now() < until)
        check_nccl(a.rank, ncclCommGetAsyncError(raw_nb, &async), "ncclCommGetAsyncError");
      r = async;
    }
    check_nccl(a.rank, r, what);
  };
  settle(ncclCommInitRankConfig(&raw_nb, a.world, nb_id, a.rank, &nb_cfg),
         "ncclCommInitRankConfig");

  world_options wo;
  wo.rank = a.rank;
  wo.size = a.world;
  wo.store = st;
  wo.backend = "nccl";
  wo.timeout = 60s;
  auto g = init_world(wo);
  if (!g) die(a.rank, g.error().to_string());
  auto& pg = **g;

  cudaStream_t stream = nullptr;
  check_cuda(a.rank, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const int n = a.world;
  if (a.rank == 0 && !a.json)
    std::printf(
        "# nccl_bench --world %d: raw NCCL vs troupe's nccl group, float32, %d device(s);\n"
        "# raw nb: raw NCCL on a non-blocking communicator (our group's mode); added: ours - raw\n"
        "#%12s %10s %11s %11s %11s %9s %9s %10s %12s\n",
        n, devices, "size(B)", "op", "raw(us)", "raw nb(us)", "troupe(us)", "raw bus", "ours bus",
        "added(us)", "vs nb(us)");
  for (const auto& op : a.ops) {
    for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 8) {
      std::size_t count = std::max<std::size_t>(bytes / sizeof(float), 1);
      std::size_t per_rank = std::max<std::size_t>(count / static_cast<std::size_t>(n), 1);
      std::size_t out_count = op == "allgather" ? per_rank * static_cast<std::size_t>(n) : count;
      void* in = nullptr;
      void* out = nullptr;
      check_cuda(a.rank, cudaMalloc(&in, count * sizeof(float)), "cudaMalloc");
      check_cuda(a.rank, cudaMalloc(&out, out_count * sizeof(float)), "cudaMalloc");
      check_cuda(a.rank, cudaMemset(in, 0, count * sizeof(float)), "cudaMemset");

      auto raw_on = [&](ncclComm_t c) {
        if (op == "allreduce") return ncclAllReduce(in, in, count, ncclFloat32, ncclSum, c, stream);
        if (op == "broadcast") return ncclBroadcast(in, in, count, ncclFloat32, 0, c, stream);
        return ncclAllGather(in, out, per_rank, ncclFloat32, c, stream);
      };
      auto raw_op = [&] { return raw_on(raw); };
      device dev = *device::cuda(a.rank);
      auto ours_op = [&] {
        tensor_view t{in, dtype::float32, count, dev};
        if (op == "allreduce") return pg.allreduce(t, {reduce_op::sum, 60s, stream});
        if (op == "broadcast") return pg.broadcast(t, {0, 60s, stream});
        return pg.allgather(t.slice(0, per_rank), tensor_view{out, dtype::float32, out_count, dev},
                            {60s, stream});
      };
      int iters = a.iters > 0            ? a.iters
                  : bytes <= (1u << 20)  ? 200
                  : bytes <= (64u << 20) ? 50
                                         : 20;

      auto time_raw = [&] {
        for (int i = 0; i < 5; ++i) check_nccl(a.rank, raw_op(), "warm-up");
        check_cuda(a.rank, cudaStreamSynchronize(stream), "sync");
        auto t0 = clock_type::now();
        for (int i = 0; i < iters; ++i) check_nccl(a.rank, raw_op(), op.c_str());
        check_cuda(a.rank, cudaStreamSynchronize(stream), "sync");
        return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
      };
      auto time_raw_nb = [&] {
        for (int i = 0; i < 5; ++i) settle(raw_on(raw_nb), "warm-up");
        check_cuda(a.rank, cudaStreamSynchronize(stream), "sync");
        auto t0 = clock_type::now();
        for (int i = 0; i < iters; ++i) settle(raw_on(raw_nb), op.c_str());
        check_cuda(a.rank, cudaStreamSynchronize(stream), "sync");
        return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
      };
      auto time_ours = [&] {
        for (int i = 0; i < 5; ++i)
          if (auto r = ours_op().wait(70s); !r) die(a.rank, r.error().to_string());
        auto t0 = clock_type::now();
        work last;
        for (int i = 0; i < iters; ++i) last = ours_op();
        if (auto r = last.wait(70s); !r) die(a.rank, r.error().to_string());
        check_cuda(a.rank, cudaStreamSynchronize(stream), "sync");
        return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
      };
      // Alternate the two sides three times each and keep the best of each.
      double raw_us = 1e300, raw_nb_us = 1e300, ours_us = 1e300;
      for (int rep = 0; rep < 3; ++rep) {
        raw_us = std::min(raw_us, time_raw());
        raw_nb_us = std::min(raw_nb_us, time_raw_nb());
        ours_us = std::min(ours_us, time_ours());
      }
      double f = bus_factor(op, n);
      double raw_bus = static_cast<double>(bytes) / raw_us / 1e3 * f;
      double ours_bus = static_cast<double>(bytes) / ours_us / 1e3 * f;
      if (a.rank == 0 && a.json)
        std::printf(
            "{\"bench\": \"%s\", \"world\": %d, \"bytes\": %zu, \"raw_us\": %.2f, "
            "\"raw_nonblocking_us\": %.2f, \"troupe_us\": %.2f, \"raw_busbw_GBps\": %.3f, "
            "\"troupe_busbw_GBps\": %.3f}\n",
            op.c_str(), n, bytes, raw_us, raw_nb_us, ours_us, raw_bus, ours_bus);
      else if (a.rank == 0)
        std::printf(" %12zu %10s %11.2f %11.2f %11.2f %9.2f %9.2f %10.2f %12.2f\n", bytes,
                    op.c_str(), raw_us, raw_nb_us, ours_us, raw_bus, ours_bus, ours_us - raw_us,
                    ours_us - raw_nb_us);
      std::fflush(stdout);
      cudaFree(in);
      cudaFree(out);
    }
  }
  cudaStreamDestroy(stream);
  ncclCommDestroy(raw);
  ncclCommDestroy(raw_nb);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  args defaults;
  defaults.world = 1;
  defaults.backend = "nccl";
  defaults.min_bytes = 8;
  defaults.max_bytes = 256u << 20;
  auto parsed = troupe::bench::parse_rank_bench_args(argc, argv, defaults, false);
  if (!parsed) return 2;
  const args& a = *parsed;
  if (a.rank >= 0) return run_rank(a);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("# nccl_bench: no CUDA device on this machine; nothing to measure\n");
    return 0;
  }
  if (a.world > devices) {
    std::cerr << "--world " << a.world << " needs " << a.world << " GPUs (one rank per GPU); "
              << "this machine has " << devices << "\n";
    return 2;
  }
  return troupe::bench::run_self_as_ranks(argc, argv, a.world);
}
