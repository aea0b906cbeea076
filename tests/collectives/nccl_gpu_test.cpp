// The nccl backend on a real GPU: a single-rank communicator runs every collective, and
// an operation that cannot finish in time aborts the communicator. Each test reports
// skipped when no CUDA device is usable.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <thread>

#include <troupe/collectives/group.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include "nccl_world.hpp"
#include "op_suite.hpp"
#include "support/gpu_skip.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using troupe::collectives::testing::buffer;
using troupe::collectives::testing::nccl_world_of_one;

namespace {

using troupe_test::no_gpu_reason;

#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    if (auto why = no_gpu_reason(); !why.empty()) TROUPE_SKIP_TEST(why); \
  } while (false)

// Device memory holding a copy of a host buffer.
struct device_buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  dtype type;
  std::size_t n;
  device_buffer(buffer& host, dtype t) : type(t), n(host.size()) {
    bytes = n * element_size(t);
    REQUIRE(cudaMalloc(&p, bytes + 8) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.view().data, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~device_buffer() { (void)cudaFree(p); }
  tensor_view view() const { return {p, type, n, device::cuda(0).value()}; }
  void to(buffer& host) const {
    REQUIRE(cudaMemcpy(host.view().data, p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
};

buffer filled(dtype t, std::size_t n, int salt) {
  buffer b(t, n);
  for (std::size_t i = 0; i < n; ++i)
    b.set(i, static_cast<double>((i * 3 + static_cast<std::size_t>(salt)) % 64));
  return b;
}

void check_same(const buffer& got, const buffer& want, const char* what, dtype t) {
  CAPTURE(what);
  CAPTURE(to_string(t));
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got.get(i) == want.get(i));
}

}  // namespace

TEST_CASE("a single-rank nccl group runs every collective on every dtype") {
  REQUIRE_GPU();
  auto g = nccl_world_of_one();
  CHECK(g->backend_name() == "nccl");
  const std::size_t n = 257;
  for (dtype t : testing::all_dtypes()) {
    CAPTURE(to_string(t));
    for (reduce_op op :
         {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product}) {
      auto host = filled(t, n, 1);
      device_buffer d(host, t);
      auto r = g->allreduce(d.view(), {op, 10s}).wait(15s);
      if (!g->supports(t, op)) {
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == errc::unsupported);
        continue;
      }
      REQUIRE_MESSAGE(r, r.error().to_string());
      buffer out(t, n);
      d.to(out);
      check_same(out, host, "allreduce", t);
    }
    auto host = filled(t, n, 2);
    buffer out(t, n);
    {
      device_buffer d(host, t);
      REQUIRE(g->broadcast(d.view(), {0, 10s}).wait(15s));
      d.to(out);
      check_same(out, host, "broadcast", t);
      auto reduced = g->reduce(d.view(), {0, reduce_op::max, 10s}).wait(15s);
      if (g->supports(t, reduce_op::max)) {
        REQUIRE_MESSAGE(reduced, reduced.error().to_string());
        d.to(out);
        check_same(out, host, "reduce", t);
      } else {
        REQUIRE_FALSE(reduced);
        CHECK(reduced.error().code() == errc::unsupported);
      }
    }
    for (int which = 0; which < 5; ++which) {
      device_buffer in(host, t);
      auto zeros = buffer(t, n);
      device_buffer o(zeros, t);
      work w;
      const char* what = "";
      switch (which) {
        case 0:
          w = g->allgather(in.view(), o.view(), {10s});
          what = "allgather";
          break;
        case 1:
          w = g->gather(in.view(), o.view(), {0, 10s});
          what = "gather";
          break;
        case 2:
          w = g->scatter(in.view(), o.view(), {0, 10s});
          what = "scatter";
          break;
        case 3:
          if (!g->supports(t, reduce_op::sum)) continue;  // refusals are checked above
          w = g->reduce_scatter(in.view(), o.view(), {reduce_op::sum, 10s});
          what = "reduce_scatter";
          break;
        case 4:
          w = g->all_to_all(in.view(), o.view(), {{}, {}, 10s});
          what = "all_to_all";
          break;
      }
      auto r = w.wait(15s);
      REQUIRE_MESSAGE(r, what, ": ", r.error().to_string());
      o.to(out);
      check_same(out, host, what, t);
    }
    {
      device_buffer in(host, t);
      auto zeros = buffer(t, n);
      device_buffer o(zeros, t);
      all_to_all_options ao;
      ao.send_counts = {n};
      ao.recv_counts = {n};
      ao.timeout = 10s;
      REQUIRE(g->all_to_all(in.view(), o.view(), ao).wait(15s));
      o.to(out);
      check_same(out, host, "uneven all_to_all", t);
    }
  }
  CHECK(g->barrier({10s}).wait(15s));
  auto host = filled(dtype::float32, 4, 0);
  device_buffer d(host, dtype::float32);
  auto self = g->send(d.view(), 0, {0, 1s}).wait(1s);
  REQUIRE_FALSE(self);
  CHECK(self.error().code() == errc::invalid_argument);
  g->shutdown(10s);
  g->shutdown(10s);
}

TEST_CASE("an nccl operation is ordered on the caller's stream without blocking the host") {
  REQUIRE_GPU();
  auto g = nccl_world_of_one();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  auto host = filled(dtype::float32, 1 << 20, 5);
  device_buffer d(host, dtype::float32);
  allreduce_options o;
  o.op = reduce_op::max;
  o.timeout = 10s;
  o.stream = s;
  auto w = g->allreduce(d.view(), o);
  // Synchronizing the caller's stream is enough to see the result.
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  buffer out(dtype::float32, host.size());
  d.to(out);
  check_same(out, host, "allreduce on the caller's stream", dtype::float32);
  CHECK(w.wait(10s));
  CHECK(w.get_future().get(1s));
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

namespace {
void CUDART_CB block_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}
}  // namespace

TEST_CASE(
    "an nccl operation that misses its timeout aborts the communicator and fails pending work") {
  REQUIRE_GPU();
  auto g = nccl_world_of_one("abort-world");
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  static int hold_ms = 4000;
  // The caller's stream is held by a host function, so the operation cannot start.
  REQUIRE(cudaLaunchHostFunc(s, block_stream, &hold_ms) == cudaSuccess);
  auto host = filled(dtype::float32, 64, 1);
  device_buffer d(host, dtype::float32);
  allreduce_options o;
  o.timeout = 500ms;
  o.stream = s;
  auto start = clock::now();
  auto first = g->allreduce(d.view(), o);
  auto second = g->allreduce(d.view(), o);
  auto r = first.wait(5s);
  auto took = clock::now() - start;
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::timeout);
  CHECK(r.error().message().find("group 'abort-world'") != std::string::npos);
  // Well before the caller's stream is released: the abort did not wait for it.
  CHECK_MESSAGE(took < 3s, "the failure took ",
                std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
  auto r2 = second.wait(1s);
  REQUIRE_FALSE(r2);
  REQUIRE(g->failure());
  // Sticky: later operations fail at once.
  auto later = g->barrier({5s}).wait(100ms);
  REQUIRE_FALSE(later);
  CHECK(later.error().message().find("failed earlier") != std::string::npos);
  (void)cudaStreamSynchronize(s);
  (void)cudaStreamDestroy(s);
  g->shutdown(5s);
}

TEST_CASE("a subgroup of an nccl world is split from the parent communicator and reduces") {
  REQUIRE_GPU();
  auto g = nccl_world_of_one("split-world");
  auto keys_before = g->spec().root_store->num_keys(5s);
  REQUIRE(keys_before);
  auto child = new_group(*g, {0});
  REQUIRE_MESSAGE(child.has_value(), child.error().to_string());
  REQUIRE(*child);
  CHECK((*child)->backend_name() == "nccl");
  // Split from the parent's communicator (ncclCommSplit), not built anew: a new one would
  // have exchanged a unique id through the store.
  auto keys_after = g->spec().root_store->num_keys(5s);
  REQUIRE(keys_after);
  CHECK(*keys_after == *keys_before);
  auto host = filled(dtype::int64, 16, 3);
  device_buffer d(host, dtype::int64);
  REQUIRE((*child)->allreduce(d.view(), {reduce_op::sum, 10s}).wait(15s));
  buffer out(dtype::int64, 16);
  d.to(out);
  check_same(out, host, "allreduce in the split group", dtype::int64);
}
