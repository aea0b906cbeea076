// GPU-labelled: NCCL groups of 2 to 4 ranks, one process and one GPU each, run the whole
// operation suite of the CPU backends (op_suite.hpp: every operation on every dtype,
// checked against values computed on the host). NCCL refuses two ranks on one GPU, so this
// runs where at least two GPUs are visible and reports itself skipped elsewhere.
//
// The suite works on host buffers; host_mirror stages them through device memory around
// each NCCL operation without blocking (the suite posts a send and a receive before
// waiting for either). The other ranks are this binary again as the peer role
// "nccl_rank" (support/peer_main.hpp).
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>

#include <troupe/collectives/group.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "op_suite.hpp"
#include "support/child_process.hpp"
#include "support/peer_main.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

namespace {

// Device memory holding a copy of a host view (zeros where the view is empty).
std::shared_ptr<void> device_copy(const tensor_view& host) {
  void* p = nullptr;
  const std::size_t n = host.nbytes() + 8;
  if (cudaMalloc(&p, n) != cudaSuccess) return nullptr;
  (void)cudaMemset(p, 0, n);
  if (host.nbytes() > 0) (void)cudaMemcpy(p, host.data, host.nbytes(), cudaMemcpyHostToDevice);
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

class host_mirror final : public process_group {
 public:
  host_mirror(std::shared_ptr<process_group> inner, int device)
      : process_group(inner->spec()), inner_(std::move(inner)), device_(device) {}
  ~host_mirror() override {
    for (auto& t : waiters_) t.join();
  }

  std::string_view backend_name() const noexcept override { return inner_->backend_name(); }
  bool supports(dtype type, reduce_op op) const noexcept override {
    return inner_->supports(type, op);
  }

  work allreduce(tensor_view t, const allreduce_options& o) override {
    return in_place(t, [&](tensor_view d) { return inner_->allreduce(d, o); });
  }
  work broadcast(tensor_view t, const broadcast_options& o) override {
    return in_place(t, [&](tensor_view d) { return inner_->broadcast(d, o); });
  }
  work reduce(tensor_view t, const reduce_options& o) override {
    return in_place(t, [&](tensor_view d) { return inner_->reduce(d, o); });
  }
  work allgather(tensor_view in, tensor_view out, const allgather_options& o) override {
    return in_out(in, out,
                  [&](tensor_view i, tensor_view u) { return inner_->allgather(i, u, o); });
  }
  work gather(tensor_view in, tensor_view out, const gather_options& o) override {
    return in_out(in, out, [&](tensor_view i, tensor_view u) { return inner_->gather(i, u, o); });
  }
  work scatter(tensor_view in, tensor_view out, const scatter_options& o) override {
    return in_out(in, out, [&](tensor_view i, tensor_view u) { return inner_->scatter(i, u, o); });
  }
  work reduce_scatter(tensor_view in, tensor_view out, const reduce_scatter_options& o) override {
    return in_out(in, out,
                  [&](tensor_view i, tensor_view u) { return inner_->reduce_scatter(i, u, o); });
  }
  work all_to_all(tensor_view in, tensor_view out, const all_to_all_options& o) override {
    return in_out(in, out,
                  [&](tensor_view i, tensor_view u) { return inner_->all_to_all(i, u, o); });
  }
  work barrier(const barrier_options& o) override { return inner_->barrier(o); }
  work send(tensor_view t, int dst, const p2p_options& o) override {
    return in_place(t, [&](tensor_view d) { return inner_->send(d, dst, o); });
  }
  work recv(tensor_view t, int src, const p2p_options& o) override {
    return in_place(t, [&](tensor_view d) { return inner_->recv(d, src, o); });
  }
  std::optional<troupe::error> failure() const override { return inner_->failure(); }
  void abort(troupe::error why) override { inner_->abort(std::move(why)); }
  void shutdown(duration timeout) override { inner_->shutdown(timeout); }

 private:
  tensor_view on_device(const tensor_view& host, const std::shared_ptr<void>& mem) const {
    return {mem.get(), host.type, host.numel, *device::cuda(device_)};
  }
  template <class Op>
  work in_place(tensor_view host, Op op) {
    auto mem = device_copy(host);
    if (!mem) return work::completed(make_error(errc::unavailable, "cudaMalloc failed"));
    return finish(op(on_device(host, mem)), host, mem, {});
  }
  template <class Op>
  work in_out(tensor_view in, tensor_view out, Op op) {
    auto din = device_copy(in), dout = device_copy(out);
    if (!din || !dout) return work::completed(make_error(errc::unavailable, "cudaMalloc failed"));
    return finish(op(on_device(in, din), on_device(out, dout)), out, dout, din);
  }
  // Completes when the inner work has, after copying `mem` back into `host`.
  work finish(work inner, tensor_view host, std::shared_ptr<void> mem, std::shared_ptr<void> keep) {
    auto [w, done] = work::make(inner.description());
    std::lock_guard lk(mu_);
    waiters_.emplace_back([inner, host, mem, keep, done = done, dev = device_] {
      auto r = inner.wait(60s);
      if (r && host.nbytes() > 0) {
        (void)cudaSetDevice(dev);
        if (cudaMemcpy(host.data, mem.get(), host.nbytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
          r = make_error(errc::unavailable, "copying the result back failed");
      }
      done.complete(std::move(r));
    });
    return w;
  }

  std::shared_ptr<process_group> inner_;
  int device_;
  std::mutex mu_;
  std::vector<std::thread> waiters_;
};

// One rank: joins an NCCL world of `world` through the store at `url` on GPU `rank` and
// runs the suite. "" when every check passed, else what failed.
std::string run_rank(const std::string& url, int rank, int world) {
  if (cudaSetDevice(rank) != cudaSuccess) return strcat("rank ", rank, ": no GPU ", rank);
  auto s = connect_store(url);
  if (!s) return strcat("rank ", rank, ": store: ", s.error().to_string());
  world_options o;
  o.rank = rank;
  o.size = world;
  o.store = std::shared_ptr<troupe::store>(std::move(*s));
  o.backend = "nccl";
  o.name = "nccl-multi";
  o.timeout = 60s;
  auto g = init_world(o);
  if (!g) return strcat("rank ", rank, ": init: ", g.error().to_string());
  std::string out;
  {
    host_mirror m(*g, rank);
    out = testing::run_op_suite(m, 30s);
  }
  (*g)->shutdown(30s);
  return out.empty() ? out : strcat("rank ", rank, ": ", out);
}

int rank_role(const std::string& arg) {
  std::istringstream in(arg);
  std::string url;
  int rank = 0, world = 0;
  in >> url >> rank >> world;
  auto e = run_rank(url, rank, world);
  if (!e.empty()) std::fprintf(stderr, "%s\n", e.c_str());
  return e.empty() ? 0 : 1;
}
TROUPE_TEST_PEER_ROLE("nccl_rank", rank_role);

}  // namespace

TEST_CASE(
    "nccl groups of several ranks, one GPU each, run every operation on every dtype with "
    "host-checked values") {
  auto n = cuda_device_count();
  if (!n) TROUPE_SKIP_TEST("no usable CUDA device: " + n.error().to_string());
  if (*n < 2)
    TROUPE_SKIP_TEST(
        strcat("needs at least 2 GPUs (NCCL refuses two ranks on one GPU); this machine has ", *n));
  for (int world = 2; world <= std::min(*n, 4); world += 2) {
    CAPTURE(world);
    auto server = tcp_store_server::start({});
    REQUIRE(server);
    std::vector<troupe::test::child_process> peers;
    for (int r = 1; r < world; ++r) {
      troupe::test::spawn_options so;
      so.env = {"TROUPE_TEST_PEER=nccl_rank",
                strcat("TROUPE_TEST_PEER_ARG=", (*server)->url(), " ", r, " ", world)};
      peers.push_back(troupe::test::child_process::start({"/proc/self/exe"}, so));
      REQUIRE(peers.back().started());
    }
    auto mine = run_rank((*server)->url(), 0, world);
    CHECK_MESSAGE(mine.empty(), mine);
    for (auto& p : peers) {
      CHECK(p.wait(120s));
      CHECK(p.exit_code() == 0);
    }
  }
}
