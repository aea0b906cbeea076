#include <doctest/doctest.h>

#include <troupe/rpc/device_helper.hpp>
#include <troupe/rpc/routing.hpp>
#include "group_fixture.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;

namespace {
device cuda(int i) { return *device::cuda(i); }
}  // namespace

TEST_CASE("the tcp backend is registered by default and duplicate names are refused") {
  CHECK(backend_registered("tcp"));
  auto dup = register_backend(
      "tcp", construct_options_handler([](duration, std::string, const backend_settings&) {
        return expected<rpc_backend_options>(rpc_backend_options{});
      }),
      init_backend_handler([](std::string, int, std::optional<int>, rpc_backend_options) {
        return expected<std::unique_ptr<agent>>(error(errc::unsupported, "test"));
      }));
  REQUIRE_FALSE(dup);
  CHECK(dup.error().code() == errc::already_exists);
  auto o = construct_rpc_backend_options(
      "tcp", std::chrono::seconds(7), "tcp://127.0.0.1:1",
      {{"num_worker_threads", "3"}, {"devices", "cuda:0,cuda:1"}, {"max_queued_bytes", "1048576"}});
  REQUIRE(o);
  CHECK(o->rpc_timeout == std::chrono::seconds(7));
  CHECK(o->num_worker_threads == 3);
  CHECK(o->max_queued_bytes == 1048576u);
  auto not_a_count = construct_rpc_backend_options("tcp", std::chrono::seconds(1), "",
                                                   {{"max_queued_bytes", "lots"}});
  REQUIRE_FALSE(not_a_count);
  CHECK(not_a_count.error().message().find("max_queued_bytes") != std::string::npos);
  CHECK(o->devices.size() == 2);
  auto bad =
      construct_rpc_backend_options("tcp", std::chrono::seconds(1), "", {{"colour", "blue"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("colour") != std::string::npos);
  auto unknown = init_rpc("w0", 0, 1, rpc_backend_options{}, "carrier-pigeon");
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == errc::not_found);
  CHECK(unknown.error().message().find("tcp") != std::string::npos);
}

TEST_CASE("a custom backend is registered once and used by name") {
  static int inits = 0;
  auto r = register_backend(
      "tcp-tuned",
      [](duration t, std::string init, const backend_settings& s) {
        auto o = construct_rpc_backend_options("tcp", t, std::move(init), s);
        if (o) o->num_worker_threads = 1;
        return o;
      },
      [](std::string name, int rank, std::optional<int> world, rpc_backend_options o) {
        ++inits;
        return init_rpc(std::move(name), rank, world, std::move(o), "tcp");
      });
  REQUIRE(r);
  auto o = construct_rpc_backend_options("tcp-tuned", std::chrono::seconds(5),
                                         "memory://custom-backend-test");
  REQUIRE(o);
  CHECK(o->num_worker_threads == 1);
  o->device_count = 0;
  o->functions = standard_functions();
  auto a = init_rpc("solo", 0, 1, *o, "tcp-tuned");
  REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
  CHECK(inits == 1);
  CHECK(*(*a)->rpc_sync<int>("solo", "add", 2, 2) == 4);
  CHECK((*a)->shutdown());
}

TEST_CASE("device maps route tensors out and reverse maps route them back") {
  device_map to_w1;
  REQUIRE(to_w1.set(cuda(0), cuda(1)));
  REQUIRE(to_w1.set(device::cpu(), cuda(2)));  // CPU to GPU is allowed
  CHECK(*route_device(cuda(0), "w0", "w1", &to_w1, route_kind::request) == cuda(1));
  CHECK(*route_device(device::cpu(), "w0", "w1", &to_w1, route_kind::request) == cuda(2));
  CHECK(*route_device(device::cpu(), "w0", "w1", nullptr, route_kind::request) == device::cpu());
  // On the callee the reverse map sends results back where they came from.
  auto back = invert(to_w1);
  CHECK(*route_device(cuda(1), "w1", "w0", &back, route_kind::reply) == cuda(0));
  CHECK(*route_device(cuda(2), "w1", "w0", &back, route_kind::reply) == device::cpu());
}

TEST_CASE("a GPU tensor to a worker with no map is refused with how to set one") {
  auto r = route_device(cuda(0), "w0", "w1", nullptr, route_kind::request);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("device_maps[\"w1\"]") != std::string::npos);
  CHECK(r.error().message().find("cuda:0") != std::string::npos);
  device_map partial;
  REQUIRE(partial.set(cuda(1), cuda(0)));
  auto p = route_device(cuda(0), "w0", "w1", &partial, route_kind::request);
  REQUIRE_FALSE(p);
  CHECK(p.error().message().find("{cuda:1 -> cuda:0}") != std::string::npos);
  auto reply = route_device(cuda(3), "w1", "w0", nullptr, route_kind::reply);
  REQUIRE_FALSE(reply);
  CHECK(reply.error().message().find("device_maps[\"w1\"] on 'w0'") != std::string::npos);
}

TEST_CASE("contiguous CPU tensors are sent in place, without a copy") {
  std::vector<double> data(64, 1.5);
  auto t = tensor::wrap(data.data(), dtype::float64, {8, 8});
  REQUIRE(t);
  std::vector<tensor> ts{*t};
  REQUIRE(prepare_outgoing(ts, "w0", "w1", nullptr, route_kind::request));
  CHECK(ts[0].data() == data.data());
  CHECK(ts[0].dev() == device::cpu());
  // A CPU tensor mapped to a GPU keeps its host bytes and is labelled for the receiver.
  device_map m;
  REQUIRE(m.set(device::cpu(), cuda(0)));
  std::vector<tensor> to_gpu{*t};
  REQUIRE(prepare_outgoing(to_gpu, "w0", "w1", &m, route_kind::request));
  CHECK(to_gpu[0].data() == data.data());
  CHECK(to_gpu[0].dev() == cuda(0));
  CHECK(needs_placement(to_gpu));
}

TEST_CASE("a tensor for a GPU the receiver does not have is refused naming it") {
  auto t = tensor::zeros(dtype::float32, {4}).with_device(cuda(1));
  std::vector<tensor> ts{t};
  auto r = place_incoming(ts, "w1", 1);
  REQUIRE_FALSE(r);
  CHECK(r.error().message().find("cuda:1") != std::string::npos);
  CHECK(r.error().worker() == "w1");
  std::vector<tensor> ok_count{t.with_device(cuda(0))};
  auto staged = place_incoming(ok_count, "w1", 1);
  if (!gpu_copies_available()) {
    REQUIRE_FALSE(staged);
    CHECK(staged.error().code() == errc::unavailable);
  }
}

TEST_CASE("CPU-to-GPU maps are sent, and a receiver without that GPU answers with an error") {
  device_map to_gpu;
  REQUIRE(to_gpu.set(device::cpu(), cuda(0)));
  auto g = make_group(2, std::make_shared<memory_store>(), [&](int r, rpc_backend_options& o) {
    if (r == 0) o.device_maps["w1"] = to_gpu;
    if (r == 1) o.device_count = 1;  // claims a GPU so the maps validate
  });
  auto t = tensor::from<float>(std::vector<float>{1, 2}, dtype::float32);
  auto r = g[0]->rpc_sync<tensor>("w1", "echo", t);
  if (gpu_copies_available()) {
    REQUIRE(r);
    CHECK(r->dev() == device::cpu());  // reversed on the way back
  } else {
    REQUIRE_FALSE(r);
    CHECK(r.error().worker() == "w1");
    CHECK(r.error().code() == errc::unavailable);
  }
  auto setup = g[1]->device_setup_now();
  CHECK(setup.reverse_maps.at("w0").find(cuda(0)) == device::cpu());
  shutdown_all(g);
}
