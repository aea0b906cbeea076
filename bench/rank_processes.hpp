// For the collective benchmarks, which run one process per rank: their common command
// line, the nccl-tests bus-bandwidth factor, and run_self_as_ranks, which hosts a TCP store
// on a free port, starts `world` copies of this program with "--rank r --store <url>" plus
// its own arguments, and waits for all of them. The copies recognize --rank and run as it.
#pragma once

#include <sys/wait.h>

#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

namespace troupe::bench {

/// --world N --rank R --store URL --backend NAME --ops a,b --min BYTES --max BYTES
/// --iters N --json; the defaults are whatever `a` holds on entry.
struct rank_bench_args {
  int world = 2;
  int rank = -1;  // -1: the launching process
  std::string store;
  std::string backend = "gloo";
  std::vector<std::string> ops{"allreduce", "broadcast", "allgather"};
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 64 << 20;
  int iters = 0;        // 0: chosen by size
  bool json = false;    // one JSON object per line (for bench/compare.py) instead of a table
  bool fresh = false;   // each rank rewrites its input before every operation (--fresh)
  bool cold = false;    // each rank evicts the caches before every operation (--cold)
  bool shared = false;  // tensors in shared host memory (--shared; collectives_bench only)
  std::string dtype = "float32";  // the element type (--dtype; collectives_bench only)
};

/// Parses into `a`; nullopt after printing why (--backend only when `with_backend`).
inline std::optional<rank_bench_args> parse_rank_bench_args(int argc, char** argv,
                                                            rank_bench_args a, bool with_backend) {
  auto split_list = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) out.push_back(item);
    return out;
  };
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--json") {
      a.json = true;
      continue;
    }
    if (k == "--fresh") {
      a.fresh = true;
      continue;
    }
    if (k == "--cold") {
      a.cold = true;
      continue;
    }
    if (k == "--shared") {
      a.shared = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << "missing value after " << k << "\n";
      return std::nullopt;
    }
    std::string v = argv[++i];
    try {
      if (k == "--world")
        a.world = std::stoi(v);
      else if (k == "--rank")
        a.rank = std::stoi(v);
      else if (k == "--store")
        a.store = v;
      else if (k == "--backend" && with_backend)
        a.backend = v;
      else if (k == "--ops")
        a.ops = split_list(v);
      else if (k == "--min")
        a.min_bytes = std::stoul(v);
      else if (k == "--max")
        a.max_bytes = std::stoul(v);
      else if (k == "--iters")
        a.iters = std::stoi(v);
      else if (k == "--dtype")
        a.dtype = v;
      else {
        std::cerr << "unknown option " << k << "\n";
        return std::nullopt;
      }
    } catch (const std::exception&) {
      std::cerr << k << " takes a number, got '" << v << "'\n";
      return std::nullopt;
    }
  }
  return a;
}

/// nccl-tests' correction from algorithm to bus bandwidth: 2(n-1)/n for allreduce,
/// (n-1)/n for allgather, 1 for broadcast.
inline double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

/// Returns 0 when every rank exited with status 0, else 1.
inline int run_self_as_ranks(int argc, char** argv, int world) {
  auto server = tcp_store_server::start({});
  if (!server) {
    std::cerr << server.error() << "\n";
    return 1;
  }
  std::vector<test::child_process> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{argv[0], "--rank", std::to_string(r), "--store",
                                  (*server)->url()};
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    ranks.push_back(test::child_process::start(args));
    if (!ranks.back().started()) {
      std::cerr << "could not start rank " << r << ": " << ranks.back().start_error() << "\n";
      return 1;  // the handles kill the ranks already started
    }
  }
  // A benchmark sweep may take long; an hour bounds a rank that hangs.
  int rc = 0;
  for (auto& p : ranks)
    if (!p.wait(std::chrono::hours(1)) || p.exit_code() != 0) rc = 1;
  return rc;
}

}  // namespace troupe::bench
