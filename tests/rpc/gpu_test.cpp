// GPU-labelled: RPC between two processes sharing cuda:0, with values checked. Every GPU
// tensor sent is written by a kernel on a non-blocking stream that is still running when
// the call is made (tests/support/cuda_fill.hpp), so a staging copy that does not wait for
// the producing stream reads zeros and the check fails. Reports itself skipped without a
// device.
//
// The peer is this same program started again as the peer role "rpc_gpu_peer"
// (support/peer_main.hpp): it serves as worker "w1" instead of running the test cases, so
// each process initializes CUDA once, never across a fork.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <troupe/rpc/backend_registry.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/tcp_store_server.hpp>
#include "support/child_process.hpp"
#include "support/cuda_fill.hpp"
#include "support/peer_main.hpp"
#include "support/skip.hpp"

using namespace troupe;
using namespace troupe::rpc;

namespace {

constexpr int spin_ms = 30;
constexpr auto call_timeout = std::chrono::seconds(60);

// A device buffer of `count` 32-bit words, zeroed, freed with the last tensor that holds it.
std::shared_ptr<void> device_words(std::size_t count) {
  void* p = nullptr;
  if (cudaMalloc(&p, count * 4 + 4) != cudaSuccess) return nullptr;
  if (cudaMemset(p, 0, count * 4 + 4) != cudaSuccess) return nullptr;
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

// One non-blocking stream per process, for the producing kernels.
cudaStream_t producer_stream() {
  static cudaStream_t s = [] {
    cudaStream_t made = nullptr;
    cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
    return made;
  }();
  return s;
}

// A u32 tensor of `count` words on cuda:0 whose values seed + i a kernel still running on
// a non-blocking stream writes; the tensor names that stream.
expected<tensor> gpu_pattern(std::size_t count, std::uint32_t seed) {
  auto mem = device_words(count);
  if (!mem) return make_error(errc::unavailable, "cudaMalloc of ", count * 4, " bytes failed");
  if (auto e = troupe_test::fill_after_spin(mem.get(), count, seed, producer_stream(), spin_ms);
      !e.empty())
    return make_error(errc::unavailable, "launching the fill kernel failed: ", e);
  auto t = tensor::wrap(mem.get(), dtype::int32, {static_cast<std::int64_t>(count)},
                        *device::cuda(0), {}, mem);
  if (!t) return t;
  return t->with_stream(producer_stream());
}

tensor cpu_pattern(std::size_t count, std::uint32_t seed) {
  auto t = tensor::zeros(dtype::int32, {static_cast<std::int64_t>(count)});
  auto* w = static_cast<std::uint32_t*>(t.data());
  for (std::size_t i = 0; i < count; ++i) w[i] = seed + static_cast<std::uint32_t>(i);
  return t;
}

// "cuda:0 0" when `t` is on cuda:0 and every word is seed + i; -1 mismatches when a copy
// failed.
std::string describe(const tensor& t, std::uint32_t seed) {
  const auto count = static_cast<std::size_t>(t.numel());
  const auto bad = t.dev().is_cuda()
                       ? troupe_test::count_mismatches_on_device(t.data(), count, seed)
                       : troupe_test::count_mismatches_on_host(t.data(), count, seed);
  return t.dev().to_string() + " " + std::to_string(bad);
}

std::shared_ptr<function_table> peer_functions() {
  auto f = std::make_shared<function_table>();
  (void)f->add("describe", [](tensor t, std::int64_t seed) {
    return describe(t, static_cast<std::uint32_t>(seed));
  });
  (void)f->add("echo", [](tensor t) { return t; });
  (void)f->add("make", [](std::int64_t count, std::int64_t seed) -> expected<tensor> {
    return gpu_pattern(static_cast<std::size_t>(count), static_cast<std::uint32_t>(seed));
  });
  return f;
}

rpc_backend_options options_for(const std::string& url) {
  rpc_backend_options o;
  o.init_method = url;
  o.rpc_timeout = call_timeout;
  o.init_timeout = std::chrono::seconds(30);
  o.shutdown_timeout = std::chrono::seconds(30);
  o.device_count = -1;
  return o;
}

// The peer process: serves as w1 until the store key "stop" appears (at most 5 minutes).
// Its argument is the store's URL, followed by " staged" when CUDA IPC is off.
int serve_as_peer(const std::string& arg) {
  const auto space = arg.find(' ');
  const std::string url = arg.substr(0, space);
  auto o = options_for(url);
  o.cuda_ipc = space == std::string::npos;
  o.functions = peer_functions();
  auto s = connect_store(url);
  if (!s) {
    std::fprintf(stderr, "rpc gpu peer: store: %s\n", s.error().to_string().c_str());
    return 2;
  }
  auto a = init_rpc("w1", 1, 2, o);
  if (!a) {
    std::fprintf(stderr, "rpc gpu peer: init: %s\n", a.error().to_string().c_str());
    return 2;
  }
  std::array<std::string, 1> keys{"stop"};
  (void)(*s)->wait(keys, std::chrono::minutes(5));
  if (auto r = (*a)->shutdown(); !r) {
    std::fprintf(stderr, "rpc gpu peer: shutdown: %s\n", r.error().to_string().c_str());
    return 3;
  }
  return 0;
}

TROUPE_TEST_PEER_ROLE("rpc_gpu_peer", serve_as_peer);

std::string skip_reason() {
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess)
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return {};
}

// w0 here and w1 in a second process of this program, w0 mapping its devices to w1's by
// `map`.
struct pair_of_workers {
  std::unique_ptr<tcp_store_server> store;
  std::unique_ptr<troupe::store> client;
  troupe::test::child_process peer;
  std::unique_ptr<agent> self;

  explicit pair_of_workers(const device_map& map, bool cuda_ipc = true) {
    auto s = tcp_store_server::start({});
    REQUIRE(s);
    store = std::move(*s);
    auto c = connect_store(store->url());
    REQUIRE(c);
    client = std::move(*c);
    troupe::test::spawn_options so;
    so.env = {"TROUPE_TEST_PEER=rpc_gpu_peer",
              "TROUPE_TEST_PEER_ARG=" + store->url() + (cuda_ipc ? "" : " staged")};
    peer = troupe::test::child_process::start({"/proc/self/exe"}, so);
    REQUIRE_MESSAGE(peer.started(), peer.start_error());
    auto o = options_for(store->url());
    o.functions = std::make_shared<function_table>();
    o.device_maps["w1"] = map;
    o.cuda_ipc = cuda_ipc;
    auto a = init_rpc("w0", 0, 2, o);
    REQUIRE_MESSAGE(a, (a ? "" : a.error().to_string()));
    self = std::move(*a);
  }
  ~pair_of_workers() {
    if (client) (void)client->set("stop", "1");
    if (self) {
      auto r = self->shutdown();
      CHECK_MESSAGE(r, (r ? "" : r.error().to_string()));
    }
    CHECK(peer.wait(std::chrono::seconds(60)));
    CHECK(peer.exit_code() == 0);
  }
};

device_map map_of(device from, device to) {
  device_map m;
  REQUIRE(m.set(from, to));
  return m;
}

// 4 bytes to 256 MiB, with sizes that are not a multiple of a page.
const std::vector<std::size_t> word_counts{
    1, 1025, std::size_t{1} << 18, (std::size_t{16} << 20) / 4 + 3, (std::size_t{256} << 20) / 4};

}  // namespace

namespace {

// What a round of calls must see, as "device mismatches" (describe()): a tensor made here
// (by a still-running kernel when `from_gpu`, else on the host) as the peer sees it, the
// same kind of tensor echoed back, and, when set, a tensor a kernel made on the peer.
struct expected_placement {
  bool from_gpu;
  std::string at_peer, echoed;
  std::optional<std::string> made_by_peer;
};

// The three calls for every size of word_counts, seeds from `seed` on.
void round_trips(pair_of_workers& w, std::uint32_t seed, const expected_placement& e) {
  auto make_here = [&](std::size_t count, std::uint32_t s) -> tensor {
    if (!e.from_gpu) return cpu_pattern(count, s);
    auto t = gpu_pattern(count, s);
    REQUIRE(t);
    return *t;
  };
  for (auto count : word_counts) {
    CAPTURE(count);
    ++seed;
    auto seen =
        w.self->rpc_sync<std::string>("w1", "describe", make_here(count, seed), std::int64_t{seed});
    REQUIRE_MESSAGE(seen, (seen ? "" : seen.error().to_string()));
    CHECK(*seen == e.at_peer);
    auto back = w.self->rpc_sync<tensor>("w1", "echo", make_here(count, seed + 1));
    REQUIRE_MESSAGE(back, (back ? "" : back.error().to_string()));
    CHECK(describe(*back, seed + 1) == e.echoed);
    if (!e.made_by_peer) continue;
    // Made by a kernel on the peer's non-blocking stream and returned at once.
    auto made = w.self->rpc_sync<tensor>("w1", "make", static_cast<std::int64_t>(count),
                                         std::int64_t{seed + 2});
    REQUIRE_MESSAGE(made, (made ? "" : made.error().to_string()));
    CHECK(describe(*made, seed + 2) == *e.made_by_peer);
  }
}

}  // namespace

TEST_CASE(
    "rpc with map cuda:0 -> cuda:0 lends kernel-written GPU tensors through CUDA IPC both ways "
    "with their values") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(*device::cuda(0), *device::cuda(0)), true);
  round_trips(w, 7, {true, "cuda:0 0", "cuda:0 0", "cuda:0 0"});
}

TEST_CASE(
    "rpc with map cuda:0 -> cuda:0 and CUDA IPC off stages kernel-written GPU tensors both ways "
    "with their values") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(*device::cuda(0), *device::cuda(0)), false);
  round_trips(w, 7, {true, "cuda:0 0", "cuda:0 0", "cuda:0 0"});
}

TEST_CASE(
    "rpc with map cpu -> cuda:0 places host tensors on the peer's GPU and returns its GPU tensors "
    "to the host") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(device::cpu(), *device::cuda(0)));
  round_trips(w, 100, {false, "cuda:0 0", "cpu 0", "cpu 0"});
}

TEST_CASE(
    "rpc with map cuda:0 -> cpu stages kernel-written GPU tensors to the peer's host and returns "
    "host tensors to the GPU") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(*device::cuda(0), device::cpu()));
  round_trips(w, 200, {true, "cpu 0", "cuda:0 0", std::nullopt});
}

TEST_CASE("a remote reference to a GPU tensor made on the peer brings its values here") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(*device::cuda(0), *device::cuda(0)));
  const std::size_t count = (std::size_t{4} << 20) / 4;
  auto ref =
      w.self->remote<tensor>("w1", "make", static_cast<std::int64_t>(count), std::int64_t{300});
  auto here = ref.to_here(call_timeout);
  REQUIRE_MESSAGE(here, (here ? "" : here.error().to_string()));
  CHECK(describe(*here, 300) == "cuda:0 0");
  // Sent back to its owner as an argument, the same values arrive there.
  auto seen = w.self->rpc_sync<std::string>("w1", "describe", *here, std::int64_t{300});
  REQUIRE_MESSAGE(seen, (seen ? "" : seen.error().to_string()));
  CHECK(*seen == "cuda:0 0");
}

TEST_CASE("a GPU tensor with no map entry for its device is refused before anything is sent") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(device::cpu(), device::cpu()));
  auto t = gpu_pattern(16, 1);
  REQUIRE(t);
  auto r = w.self->rpc_sync<std::string>("w1", "describe", *t, std::int64_t{1});
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("cuda:0") != std::string::npos);
}

TEST_CASE(
    "a GPU tensor from a stream-ordered pool, which CUDA IPC cannot share, is staged with its "
    "values") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  pair_of_workers w(map_of(*device::cuda(0), *device::cuda(0)));
  const std::size_t count = (std::size_t{1} << 20) + 5;
  void* p = nullptr;
  REQUIRE(cudaMallocAsync(&p, count * 4, producer_stream()) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(p, 0, count * 4, producer_stream()) == cudaSuccess);
  REQUIRE(troupe_test::fill_after_spin(p, count, 900, producer_stream(), spin_ms).empty());
  auto t = tensor::wrap(p, dtype::int32, {static_cast<std::int64_t>(count)}, *device::cuda(0));
  REQUIRE(t);
  auto seen = w.self->rpc_sync<std::string>("w1", "describe", t->with_stream(producer_stream()),
                                            std::int64_t{900});
  REQUIRE_MESSAGE(seen, (seen ? "" : seen.error().to_string()));
  CHECK(*seen == "cuda:0 0");
  REQUIRE(cudaFreeAsync(p, producer_stream()) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(producer_stream()) == cudaSuccess);
}

TEST_CASE("two agents of one process pass GPU tensors through the lent pointer itself") {
  if (auto why = skip_reason(); !why.empty()) TROUPE_SKIP_TEST(why);
  auto server = tcp_store_server::start({});
  REQUIRE(server);
  const std::string url = (*server)->url();
  auto o1 = options_for(url);
  o1.functions = peer_functions();
  std::unique_ptr<agent> w1;
  std::thread starter([&] {
    auto a = init_rpc("w1", 1, 2, o1);
    if (a) w1 = std::move(*a);
  });
  auto o0 = options_for(url);
  o0.functions = std::make_shared<function_table>();
  o0.device_maps["w1"] = map_of(*device::cuda(0), *device::cuda(0));
  auto w0 = init_rpc("w0", 0, 2, o0);
  starter.join();
  REQUIRE_MESSAGE(w0, (w0 ? "" : w0.error().to_string()));
  REQUIRE(w1);
  for (std::size_t count : {std::size_t{1}, std::size_t{4} << 20}) {
    CAPTURE(count);
    auto t = gpu_pattern(count, 500);
    REQUIRE(t);
    auto seen = (*w0)->rpc_sync<std::string>("w1", "describe", *t, std::int64_t{500});
    REQUIRE_MESSAGE(seen, (seen ? "" : seen.error().to_string()));
    CHECK(*seen == "cuda:0 0");
    auto made =
        (*w0)->rpc_sync<tensor>("w1", "make", static_cast<std::int64_t>(count), std::int64_t{501});
    REQUIRE_MESSAGE(made, (made ? "" : made.error().to_string()));
    CHECK(describe(*made, 501) == "cuda:0 0");
  }
  std::thread stopper([&] { (void)w1->shutdown(); });
  CHECK((*w0)->shutdown());
  stopper.join();
}
