// GPU-labelled: DDP and Join over an NCCL group of one, with GPU weights and gradients.
// One rank cannot show an average other than its own values, so these check that every
// path of the strategy (bucketed all-reduce, join counters, object broadcast, barrier,
// model averaging) runs on GPU memory and leaves the values exactly as they were. Reports
// itself skipped without a device.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <vector>

#include <troupe/collectives/group.hpp>
#include <troupe/collectives/join.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/training/ddp.hpp>
#include "../collectives/nccl_world.hpp"
#include "support/gpu_skip.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::training;
using collectives::testing::nccl_world_of_one;

namespace {

using troupe_test::no_gpu_reason;

// `n` floats on cuda:0 holding `host`.
struct device_floats {
  float* p = nullptr;
  std::size_t n = 0;
  explicit device_floats(const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~device_floats() { (void)cudaFree(p); }
  std::vector<float> read() const {
    std::vector<float> out(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  tensor_view slice(std::size_t at, std::size_t count) const {
    return {p + at, dtype::float32, count, *device::cuda(0)};
  }
};

std::vector<float> pattern(std::size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<float>(i % 97);
  return v;
}

}  // namespace

TEST_CASE(
    "ddp over an nccl group of one keeps GPU gradients and weights through join, broadcast and "
    "barrier") {
  if (auto why = no_gpu_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  auto g = nccl_world_of_one("ddp-gpu");
  // Two layers, every weight and gradient in one allocation each; with these caps the
  // second layer fills the first bucket and the first layer the second.
  const std::size_t n1 = 100, n2 = 24, total = 2 * (n1 + n2);
  const auto values_host = pattern(total, 0.5f, 1.0f), grads_host = pattern(total, 0.25f, -3.0f);
  device_floats values(values_host), grads(grads_host);
  std::vector<parameter> params;
  std::size_t at = 0;
  for (int layer = 0; layer < 2; ++layer)
    for (auto [name, n] : {std::pair{"weight", n1}, std::pair{"bias", n2}}) {
      params.push_back(
          {strcat("layer", layer, ".", name), values.slice(at, n), grads.slice(at, n)});
      at += n;
    }
  ddp_options o;
  o.first_bucket_cap_bytes = 256;
  o.bucket_cap_bytes = 1024;
  o.timeout = 30s;
  auto d = ddp::make(g, params, o);
  REQUIRE_MESSAGE(d, (d ? "" : d.error().to_string()));
  CHECK((*d)->bucket_plans().size() == 2);
  auto j = collectives::join::make({d->get()});
  REQUIRE_MESSAGE(j, (j ? "" : j.error().to_string()));
  auto steps = j->run([&]() -> expected<void> {
    for (int s = 0; s < 3; ++s) TROUPE_TRY((*d)->sync_gradients());
    return ok();
  });
  REQUIRE_MESSAGE(steps, (steps ? "" : steps.error().to_string()));
  CHECK((*d)->steps() == 3);
  CHECK(grads.read() == grads_host);
  CHECK(values.read() == values_host);
  auto obj = (*d)->broadcast_object(std::vector<int>{4, 5, 6}, 0);
  REQUIRE_MESSAGE(obj, (obj ? "" : obj.error().to_string()));
  CHECK(*obj == std::vector<int>{4, 5, 6});
  CHECK((*d)->barrier());
  CHECK((*d)->reduce(grads.slice(0, n1)));
  CHECK(grads.read() == grads_host);
}

TEST_CASE("ddp model averaging over an nccl group of one averages GPU weights in place") {
  if (auto why = no_gpu_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  auto g = nccl_world_of_one("ddp-gpu-averaging");
  const auto values_host = pattern(512, 2.0f, 0.5f), grads_host = pattern(512, 1.0f, 0.0f);
  device_floats values(values_host), grads(grads_host);
  ddp_options o;
  o.averaging = averaging_options{1, 1};
  o.timeout = 30s;
  auto d = ddp::make(g, {{"w", values.slice(0, 512), grads.slice(0, 512)}}, o);
  REQUIRE_MESSAGE(d, (d ? "" : d.error().to_string()));
  int averaged = 0;
  for (int s = 0; s < 3; ++s) {
    REQUIRE((*d)->sync_gradients());
    auto a = (*d)->after_optimizer_step();
    REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
    averaged += *a ? 1 : 0;
  }
  CHECK(averaged == 2);  // after the one warm-up step, every step
  CHECK(values.read() == values_host);
  CHECK(grads.read() == grads_host);
}
