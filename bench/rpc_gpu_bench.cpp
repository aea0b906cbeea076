// RPC GPU echo between two processes sharing cuda:0, device map {cuda:0 -> cuda:0}: the
// caller sends a tensor on cuda:0 and the callee returns it, so each roundtrip moves the
// bytes GPU -> GPU twice. Also measured in the same run: the physical cost of the path the
// bytes take (a pinned device -> host plus host -> device copy, twice per roundtrip), so
// the figures say how far the transport is from the copies it cannot avoid.
//   rpc_gpu_bench [--sizes 16777216,268435456] [--iters N] [--warmup N] [--staged]
// --staged turns CUDA IPC off on both sides (rpc_backend_options::cuda_ipc): the bytes go
// through pinned host memory and the socket instead of device to device.
// Prints one JSON object per measurement (impl, bench, size, figures), like rpc_bench;
// bench/rpc_gpu_tensorpipe.py prints the same for PyTorch's TensorPipe agent. Exits 0 with
// a note when there is no CUDA device.
//
// The callee is this program started again with --peer <store url>.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"

using namespace troupe;
using namespace troupe::rpc;

namespace {

using clock_type = std::chrono::steady_clock;

struct config {
  std::vector<std::size_t> sizes{std::size_t{16} << 20, std::size_t{256} << 20};
  int iters = 20;
  int warmup = 3;
  bool staged = false;
  std::string peer_url;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

rpc_backend_options options_for(const std::string& url, bool staged) {
  rpc_backend_options o;
  o.cuda_ipc = !staged;
  o.init_method = url;
  o.rpc_timeout = std::chrono::seconds(120);
  o.init_timeout = std::chrono::seconds(60);
  o.shutdown_timeout = std::chrono::seconds(60);
  o.device_count = -1;
  return o;
}

int serve(const std::string& url, bool staged) {
  auto o = options_for(url, staged);
  o.functions = std::make_shared<function_table>();
  (void)o.functions->add("echo", [](tensor t) { return t; });
  auto s = connect_store(url);
  if (!s) return 2;
  auto a = init_rpc("w1", 1, 2, o);
  if (!a) {
    std::fprintf(stderr, "rpc_gpu_bench peer: %s\n", a.error().to_string().c_str());
    return 2;
  }
  std::array<std::string, 1> keys{"stop"};
  (void)(*s)->wait(keys, std::chrono::minutes(10));
  return (*a)->shutdown() ? 0 : 3;
}

// Median seconds of a pinned device -> host then host -> device copy of `n` bytes.
double staging_copy_seconds(void* dev, std::size_t n, int iters) {
  void* host = nullptr;
  void* dev2 = nullptr;
  if (cudaMallocHost(&host, n) != cudaSuccess || cudaMalloc(&dev2, n) != cudaSuccess) return -1;
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto start = clock_type::now();
    cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost);
    cudaMemcpy(dev2, host, n, cudaMemcpyHostToDevice);
    t.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  cudaFreeHost(host);
  cudaFree(dev2);
  return median(t);
}

int drive(const config& c, const char* self) {
  auto server = tcp_store_server::start({});
  if (!server) {
    std::fprintf(stderr, "rpc_gpu_bench: store: %s\n", server.error().to_string().c_str());
    return 1;
  }
  const std::string url = (*server)->url();
  std::vector<std::string> argv{self, "--peer", url};
  if (c.staged) argv.push_back("--staged");
  auto peer = troupe::test::child_process::start(argv);
  if (!peer.started()) {
    std::fprintf(stderr, "rpc_gpu_bench: cannot start the peer: %s\n", peer.start_error().c_str());
    return 1;
  }
  auto o = options_for(url, c.staged);
  o.functions = std::make_shared<function_table>();
  device_map m;
  (void)m.set(*device::cuda(0), *device::cuda(0));
  o.device_maps["w1"] = m;
  auto a = init_rpc("w0", 0, 2, o);
  if (!a) {
    std::fprintf(stderr, "rpc_gpu_bench: init: %s\n", a.error().to_string().c_str());
    return 1;
  }
  int rc = 0;
  for (auto n : c.sizes) {
    void* p = nullptr;
    if (cudaMalloc(&p, n) != cudaSuccess || cudaMemset(p, 1, n) != cudaSuccess) {
      std::fprintf(stderr, "rpc_gpu_bench: cudaMalloc of %zu bytes failed\n", n);
      rc = 1;
      break;
    }
    auto t = tensor::wrap(p, dtype::uint8, {static_cast<std::int64_t>(n)}, *device::cuda(0));
    std::vector<double> secs;
    for (int i = 0; i < c.warmup + c.iters; ++i) {
      auto start = clock_type::now();
      auto back = (*a)->rpc_sync<tensor>("w1", "echo", *t);
      const double s = std::chrono::duration<double>(clock_type::now() - start).count();
      if (!back || back->nbytes() != n || !back->dev().is_cuda()) {
        std::fprintf(stderr, "rpc_gpu_bench: echo of %zu bytes failed: %s\n", n,
                     back ? "wrong tensor back" : back.error().to_string().c_str());
        rc = 1;
        break;
      }
      if (i >= c.warmup) secs.push_back(s);
    }
    if (rc != 0) {
      cudaFree(p);
      break;
    }
    const double p50 = median(secs);
    const double copies = staging_copy_seconds(p, n, std::max(3, c.iters / 2));
    cudaFree(p);
    std::printf(
        "{\"impl\": \"troupe\", \"bench\": \"gpu_echo\", \"path\": \"%s\", \"size\": %zu, "
        "\"p50_ms\": %.3f, \"gbps\": %.2f, \"iters\": %d}\n",
        c.staged ? "staged" : "cuda_ipc", n, p50 * 1e3, 2.0 * static_cast<double>(n) / p50 / 1e9,
        c.iters);
    std::printf(
        "{\"impl\": \"cuda_memcpy\", \"bench\": \"staging_copies\", \"size\": %zu, "
        "\"p50_ms\": %.3f, \"note\": \"2x (D2H + H2D) pinned, the staging floor of one "
        "echo\"}\n",
        n, 2e3 * copies);
    std::fflush(stdout);
  }
  (void)(*a)->rpc_sync<tensor>("w1", "echo", tensor::zeros(dtype::uint8, {1}));
  auto cli = connect_store(url);
  if (cli) (void)(*cli)->set("stop", "1");
  if (auto r = (*a)->shutdown(); !r) {
    std::fprintf(stderr, "rpc_gpu_bench: shutdown: %s\n", r.error().to_string().c_str());
    rc = rc ? rc : 1;
  }
  if (!peer.wait(std::chrono::seconds(60)) || peer.exit_code() != 0) rc = rc ? rc : 1;
  return rc;
}

std::vector<std::size_t> parse_sizes(const char* s) {
  std::vector<std::size_t> out;
  std::string v(s);
  std::size_t pos = 0;
  while (pos <= v.size()) {
    auto comma = v.find(',', pos);
    auto item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) out.push_back(std::strtoull(item.c_str(), nullptr, 10));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rpc_gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sizes")
      c.sizes = parse_sizes(next());
    else if (a == "--iters")
      c.iters = std::atoi(next());
    else if (a == "--warmup")
      c.warmup = std::atoi(next());
    else if (a == "--peer")
      c.peer_url = next();
    else if (a == "--staged")
      c.staged = true;
    else {
      std::fprintf(stderr,
                   "rpc_gpu_bench: unknown argument '%s'; see the comment at the top of "
                   "bench/rpc_gpu_bench.cpp\n",
                   a.c_str());
      return 2;
    }
  }
  if (!c.peer_url.empty()) return serve(c.peer_url, c.staged);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("rpc_gpu_bench: no CUDA device here; nothing measured\n");
    return 0;
  }
  if (c.sizes.empty() || c.iters < 1) {
    std::fprintf(stderr, "rpc_gpu_bench: --sizes needs at least one size and --iters at least 1\n");
    return 2;
  }
  std::printf("# rpc_gpu_bench --iters %d%s (two processes on cuda:0, map {cuda:0 -> cuda:0})\n",
              c.iters, c.staged ? " --staged" : "");
  return drive(c, "/proc/self/exe");
}
