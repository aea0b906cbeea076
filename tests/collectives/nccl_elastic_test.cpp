// GPU-labelled: an elastic group on the nccl backend follows the membership epochs in the
// same process. Two processes, one GPU each, build epoch 2; the second leaves and the
// first shrinks its communicator (ncclCommShrink, or a new one with an NCCL older than
// 2.27) to a world of 1; a third process joins and every member re-creates the
// communicator for a world of 2 again. Each step checks the value of an allreduce. NCCL
// refuses two ranks on one GPU, so this needs two GPUs and reports itself skipped
// elsewhere. The other members are this binary again as the peer role "nccl_elastic".
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/core/codec.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"
#include "support/peer_main.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

namespace {

constexpr const char* group_name = "nccl-elastic";

// One member: a membership service and an elastic nccl group over the store at `url`.
struct member_process {
  std::shared_ptr<store> s;
  std::shared_ptr<membership::service> members;
  std::unique_ptr<elastic_group> group;
};

expected<member_process> start_member(const std::string& url, const std::string& name) {
  member_process m;
  auto s = connect_store(url);
  if (!s) return std::move(s).error();
  m.s = std::shared_ptr<store>(std::move(*s));
  membership::service_options o;
  o.name = name;
  o.host = "gpu-host";
  o.heartbeat_timeout = 5s;
  o.heartbeat_interval = 200ms;
  auto svc = membership::service::join(std::make_shared<prefix_store>(m.s, "membership"), o, 30s);
  if (!svc) return std::move(svc).error();
  m.members = std::shared_ptr<membership::service>(std::move(*svc));
  elastic_options eo;
  eo.name = group_name;
  eo.backend = "nccl";
  eo.build_timeout = 60s;
  auto g = elastic_group::make(m.members, m.s, eo);
  if (!g) return std::move(g).error();
  m.group = std::move(*g);
  return m;
}

// Rebuilds for an epoch of `size` members (waiting for it) and allreduces `value` on
// `dev`; the sum, or the error.
expected<float> rebuild_and_sum(member_process& m, std::size_t size, float value, int dev) {
  for (;;) {
    auto latest = m.group->latest();
    if (latest.size() == size) break;
    auto next = m.group->wait_for_change(latest.number, 60s);
    if (!next) return std::move(next).error();
  }
  auto v = m.group->rebuild(60s);
  if (!v) return std::move(v).error();
  if (static_cast<std::size_t>(v->group->size()) != size)
    return make_error(errc::internal, "epoch ", v->epoch.number, " has ", v->group->size(),
                      " members, expected ", size);
  if (auto r = cudaSetDevice(dev); r != cudaSuccess)
    return make_error(errc::unavailable, "cudaSetDevice(", dev, ") failed");
  void* p = nullptr;
  if (cudaMalloc(&p, sizeof(float)) != cudaSuccess)
    return make_error(errc::unavailable, "cudaMalloc failed");
  (void)cudaMemcpy(p, &value, sizeof value, cudaMemcpyHostToDevice);
  auto r =
      v->group
          ->allreduce(tensor_view{p, dtype::float32, 1, *device::cuda(dev)}, {reduce_op::sum, 30s})
          .wait(40s);
  float out = -1;
  (void)cudaMemcpy(&out, p, sizeof out, cudaMemcpyDeviceToHost);
  (void)cudaFree(p);
  if (!r) return std::move(r).error();
  return out;
}

// The peer role: "<url> <name> <device> <first world> <value> <leave|stay>". Joins, checks
// the sum of the first world (expected in the store under test/sum-<name>), then leaves
// when told (test/leave) or stays until test/done.
int elastic_role(const std::string& arg) {
  std::istringstream in(arg);
  std::string url, name, mode;
  int dev = 0;
  std::size_t world = 0;
  float value = 0, expect = 0;
  in >> url >> name >> dev >> world >> value >> expect >> mode;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), what.c_str());
    return 1;
  };
  auto m = start_member(url, name);
  if (!m) return fail(m.error().to_string());
  auto sum = rebuild_and_sum(*m, world, value, dev);
  if (!sum) return fail(sum.error().to_string());
  if (*sum != expect) return fail(strcat("allreduce gave ", *sum, ", expected ", expect));
  const std::string wait_key = mode == "leave" ? "test/leave" : "test/done";
  if (auto got = m->s->get(wait_key, 120s); !got) return fail(got.error().to_string());
  m->group->shutdown(30s);
  if (auto r = m->members->shutdown(30s); !r) return fail(r.error().to_string());
  return 0;
}
TROUPE_TEST_PEER_ROLE("nccl_elastic", elastic_role);

troupe::test::child_process start_peer(const std::string& url, const std::string& name, int dev,
                                       int world, float value, float expect,
                                       const std::string& mode) {
  troupe::test::spawn_options so;
  so.env = {"TROUPE_TEST_PEER=nccl_elastic", strcat("TROUPE_LOCAL_RANK=", dev),
            strcat("TROUPE_TEST_PEER_ARG=", url, " ", name, " ", dev, " ", world, " ", value, " ",
                   expect, " ", mode)};
  return troupe::test::child_process::start({"/proc/self/exe"}, so);
}

}  // namespace

TEST_CASE(
    "an nccl elastic group shrinks from 2 GPUs to 1 when a member leaves and grows back to 2 when "
    "one joins") {
  auto n = cuda_device_count();
  if (!n) TROUPE_SKIP_TEST("no usable CUDA device: " + n.error().to_string());
  if (*n < 2)
    TROUPE_SKIP_TEST(
        strcat("needs at least 2 GPUs (NCCL refuses two ranks on one GPU); this machine has ", *n));
  auto server = tcp_store_server::start({});
  REQUIRE(server);
  const auto url = (*server)->url();
  auto m = start_member(url, "w0");
  REQUIRE_MESSAGE(m.has_value(), m.error().to_string());
  // World of 2: w0 (GPU 0, value 1) and w1 (GPU 1, value 2).
  auto w1 = start_peer(url, "w1", 1, 2, 2.0f, 3.0f, "leave");
  REQUIRE(w1.started());
  auto two = rebuild_and_sum(*m, 2, 1.0f, 0);
  REQUIRE_MESSAGE(two.has_value(), two.error().to_string());
  CHECK(*two == 3.0f);
  // w1 leaves: w0 alone, on the shrunk (or re-created) communicator.
  REQUIRE(m->s->set("test/leave", to_bytes(std::string("1")), 10s));
  CHECK(w1.wait(60s));
  CHECK(w1.exit_code() == 0);
  auto one = rebuild_and_sum(*m, 1, 1.0f, 0);
  REQUIRE_MESSAGE(one.has_value(), one.error().to_string());
  CHECK(*one == 1.0f);
  CHECK(m->group->current().group->size() == 1);
  // w2 joins on GPU 1: a new communicator for a world of 2 again.
  auto w2 = start_peer(url, "w2", 1, 2, 5.0f, 6.0f, "stay");
  REQUIRE(w2.started());
  auto again = rebuild_and_sum(*m, 2, 1.0f, 0);
  REQUIRE_MESSAGE(again.has_value(), again.error().to_string());
  CHECK(*again == 6.0f);
  REQUIRE(m->s->set("test/done", to_bytes(std::string("1")), 10s));
  CHECK(w2.wait(60s));
  CHECK(w2.exit_code() == 0);
  m->group->shutdown(30s);
  CHECK(m->members->shutdown(30s));
}
