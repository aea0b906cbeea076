// Several gloo ranks as threads of one process, sharing an in-process store.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <troupe/collectives/autograd_all_to_all.hpp>
#include <troupe/collectives/group.hpp>
#include <troupe/core/metrics.hpp>
#include <troupe/store/memory_store.hpp>
#include "op_suite.hpp"
#include "thread_ranks.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;
using troupe::collectives::testing::on_ranks;

TEST_CASE("a single-rank gloo group runs every collective on every dtype") {
  auto out = on_ranks(1, [](process_group& g) { return testing::run_op_suite(g, 5s); });
  CHECK(out[0] == "");
}

TEST_CASE("three gloo ranks in threads run every collective on every dtype") {
  auto out = on_ranks(3, [](process_group& g) { return testing::run_op_suite(g, 10s); });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE(
    "every collective a gloo group ran reaches the process's metrics soon after, and its queue "
    "gauge comes back to zero") {
  auto& calls = metrics::get_counter("troupe_collective_calls_total",
                                     "gloo collectives this worker completed", {{"op", "reduce"}});
  auto& queued = metrics::get_gauge("troupe_collective_queue_depth",
                                    "collectives queued on gloo groups, not yet started");
  const auto before = calls.value();
  constexpr int ops = 150;  // two batches and a rest
  auto out = on_ranks(1, [&](process_group& g) -> std::string {
    float x[16] = {};
    tensor_view v{x, dtype::float32, 16, device::cpu()};
    std::vector<work> queue;  // some wait in the queue, some run inline
    for (int i = 0; i < ops; ++i) {
      queue.push_back(g.reduce(v, {0, reduce_op::sum, 5s}));
      if (i % 3 == 0)
        for (auto& w : queue)
          if (auto r = w.wait(5s); !r) return r.error().to_string();
      if (i % 3 == 0) queue.clear();
    }
    for (auto& w : queue)
      if (auto r = w.wait(5s); !r) return r.error().to_string();
    // The group lives on here: its figures arrive by its own batches, not its end.
    const auto until = std::chrono::steady_clock::now() + 2s;
    while (calls.value() < before + ops && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    return "";
  });
  CHECK(out[0] == "");
  CHECK(calls.value() == before + ops);
  CHECK(queued.value() == 0);
}

TEST_CASE("bad arguments and unsupported dtype/op pairs fail the work before anything is sent") {
  auto out = on_ranks(2, [](process_group& g) -> std::string {
    std::int32_t x[4] = {};
    tensor_view v{x, dtype::int32, 4, device::cpu()};
    auto avg = g.allreduce(v, {reduce_op::avg, 5s}).wait(1s);
    if (avg || avg.error().code() != errc::unsupported) return "avg on int32 was accepted";
    if (avg.error().message().find("int32") == std::string::npos) return "no dtype named";
    auto root = g.broadcast(v, {7, 5s}).wait(1s);
    if (root || root.error().code() != errc::invalid_argument) return "root 7 was accepted";
    auto self = g.send(v, g.rank(), {0, 5s}).wait(1s);
    if (self || self.error().code() != errc::invalid_argument) return "send to self was accepted";
    auto sizes = g.allgather(v, v, {5s}).wait(1s);
    if (sizes || sizes.error().code() != errc::invalid_argument) return "allgather sizes accepted";
    tensor_view gpu{x, dtype::int32, 4, device::cuda(0).value()};
    auto dev = g.allreduce(gpu, {reduce_op::sum, 5s}).wait(1s);
    if (dev || dev.error().code() != errc::invalid_argument) return "a CUDA tensor was accepted";
    // The group is not broken by refused arguments.
    auto b = g.barrier({5s}).wait(10s);
    return b ? std::string() : "barrier after refusals: " + b.error().to_string();
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE(
    "work queued on a group that shuts down fails with shut_down, and shutdown is idempotent") {
  auto out = on_ranks(1, [](process_group& g) -> std::string {
    g.shutdown(1s);
    g.shutdown(1s);
    float x = 1;
    auto r = g.allreduce(tensor_view{&x, dtype::float32, 1, device::cpu()}).wait(1s);
    if (r || r.error().code() != errc::shut_down) return "an op ran after shutdown";
    return {};
  });
  CHECK(out[0] == "");
}

TEST_CASE("work completions chain through the core future") {
  auto out = on_ranks(2, [](process_group& g) -> std::string {
    double x = g.rank() + 1.0;
    auto f = g.allreduce(tensor_view{&x, dtype::float64, 1, device::cpu()}, {reduce_op::sum, 5s})
                 .get_future()
                 .then([&x] { return x * 2; });
    auto v = f.get(10s);
    if (!v) return v.error().to_string();
    return *v == 6.0 ? std::string() : "chained value " + std::to_string(*v);
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("point-to-point transfers between two ranks do not disturb later collectives") {
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    std::int64_t v = 40 + g.rank();
    tensor_view t{&v, dtype::int64, 1, device::cpu()};
    if (g.rank() == 0)
      if (auto r = g.send(t, 1, {9, 5s}).wait(10s); !r) return "send: " + r.error().to_string();
    if (g.rank() == 1) {
      if (auto r = g.recv(t, 0, {9, 5s}).wait(10s); !r) return "recv: " + r.error().to_string();
      if (v != 40) return "received " + std::to_string(v);
    }
    std::int64_t one = 1;
    auto r = g.allreduce(tensor_view{&one, dtype::int64, 1, device::cpu()}, {reduce_op::sum, 5s})
                 .wait(10s);
    if (!r) return "allreduce after p2p: " + r.error().to_string();
    return one == 3 ? std::string() : "sum " + std::to_string(one);
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("a recv whose sender never sends fails within its timeout naming the sender") {
  auto out = on_ranks(2, [](process_group& g) -> std::string {
    float x = 0;
    if (g.rank() == 0) {
      auto start = clock::now();
      auto r = g.recv(tensor_view{&x, dtype::float32, 1, device::cpu()}, 1, {1, 500ms}).wait(5s);
      if (r) return "the recv succeeded";
      if (clock::now() - start > 1500ms) return "the recv took too long to fail";
      if (r.error().message().find("rank [1] did not arrive") == std::string::npos)
        return "the sender is not named: " + r.error().to_string();
      if (!g.failure()) return "the failure is not sticky";
    }
    return {};
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("joining a world whose other ranks never come fails within the timeout") {
  world_options o;
  o.rank = 0;
  o.size = 2;
  o.store = std::make_shared<memory_store>();
  o.backend = "gloo";
  o.name = "lonely";
  o.timeout = 500ms;
  auto start = clock::now();
  auto g = init_world(o);
  CHECK(clock::now() - start < 3s);
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::timeout);
  CHECK(g.error().message().find("'lonely'") != std::string::npos);
}

namespace {

// Elements rank `from` sends to rank `to` in the uneven tests (zero for some pairs).
std::size_t a2a_count(int from, int to) { return static_cast<std::size_t>((from + 2 * to) % 4); }
// The value of element k of the block rank `from` sends to rank `to`.
double a2a_value(int from, int to, std::size_t k) {
  return 1000.0 * from + 100.0 * to + static_cast<double>(k);
}

}  // namespace

TEST_CASE("autograd all_to_all with uneven splits: forward moves blocks, backward returns them") {
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    const int n = g.size(), me = g.rank();
    std::vector<std::size_t> sends, recvs;
    for (int p = 0; p < n; ++p) {
      sends.push_back(a2a_count(me, p));
      recvs.push_back(a2a_count(p, me));
    }
    std::vector<double> in;
    for (int p = 0; p < n; ++p)
      for (std::size_t k = 0; k < a2a_count(me, p); ++k) in.push_back(a2a_value(me, p, k));
    std::vector<double> fwd(std::accumulate(recvs.begin(), recvs.end(), std::size_t{0}), -1);
    // A non-owning handle: the group outlives this test body.
    std::shared_ptr<process_group> gp(std::shared_ptr<process_group>(), &g);
    auto fn = autograd_all_to_all::make(gp, sends, recvs);
    if (!fn) return "make: " + fn.error().to_string();
    if (auto r = fn->forward(tensor_view::of(std::span(in)), tensor_view::of(std::span(fwd)), {5s})
                     .wait(10s);
        !r)
      return "forward: " + r.error().to_string();
    std::size_t at = 0;
    for (int p = 0; p < n; ++p)
      for (std::size_t k = 0; k < a2a_count(p, me); ++k, ++at)
        if (fwd[at] != a2a_value(p, me, k))
          return "forward element " + std::to_string(at) + " is " + std::to_string(fwd[at]) +
                 ", expected " + std::to_string(a2a_value(p, me, k));
    // Gradients that identify their origin: output element + 0.5. Backward must bring
    // each back to the rank and position of the input element it came from.
    std::vector<double> grad_out(fwd.size());
    for (std::size_t i = 0; i < fwd.size(); ++i) grad_out[i] = fwd[i] + 0.5;
    std::vector<double> grad_in(in.size(), -1);
    if (auto r = fn->backward(tensor_view::of(std::span(grad_out)),
                              tensor_view::of(std::span(grad_in)), {5s})
                     .wait(10s);
        !r)
      return "backward: " + r.error().to_string();
    for (std::size_t i = 0; i < in.size(); ++i)
      if (grad_in[i] != in[i] + 0.5)
        return "gradient " + std::to_string(i) + " is " + std::to_string(grad_in[i]) +
               ", expected " + std::to_string(in[i] + 0.5);
    return {};
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("autograd all_to_all with equal splits round-trips the gradient") {
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    const int n = g.size(), me = g.rank();
    const std::size_t block = 2;
    std::vector<float> in, fwd(block * 3, -1), grad_in(block * 3, -1);
    for (int p = 0; p < n; ++p)
      for (std::size_t k = 0; k < block; ++k) in.push_back(static_cast<float>(a2a_value(me, p, k)));
    autograd_all_to_all fn(std::shared_ptr<process_group>(std::shared_ptr<process_group>(), &g));
    if (auto r = fn.forward(tensor_view::of(std::span(in)), tensor_view::of(std::span(fwd)), {5s})
                     .wait(10s);
        !r)
      return "forward: " + r.error().to_string();
    for (int p = 0; p < n; ++p)
      for (std::size_t k = 0; k < block; ++k)
        if (fwd[static_cast<std::size_t>(p) * block + k] != static_cast<float>(a2a_value(p, me, k)))
          return "forward block from rank " + std::to_string(p) + " is wrong";
    std::vector<float> grad_out(fwd);
    for (auto& v : grad_out) v *= 2;
    if (auto r = fn.backward(tensor_view::of(std::span(grad_out)),
                             tensor_view::of(std::span(grad_in)), {5s})
                     .wait(10s);
        !r)
      return "backward: " + r.error().to_string();
    for (std::size_t i = 0; i < in.size(); ++i)
      if (grad_in[i] != in[i] * 2) return "gradient " + std::to_string(i) + " is wrong";
    return {};
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("autograd all_to_all refuses size mismatches before anything is sent") {
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    std::shared_ptr<process_group> gp(std::shared_ptr<process_group>(), &g);
    auto short_list = autograd_all_to_all::make(gp, {1, 1}, {1, 1, 1});
    if (short_list || short_list.error().code() != errc::invalid_argument)
      return "two send counts in a group of three were accepted";
    if (short_list.error().message().find("expected 3 send counts") == std::string::npos ||
        short_list.error().message().find("got 2") == std::string::npos)
      return "the count message is unclear: " + short_list.error().to_string();
    auto fn = autograd_all_to_all::make(gp, {1, 2, 3}, {2, 2, 2});
    if (!fn) return "make: " + fn.error().to_string();
    std::vector<float> five(5), six(6), seven(7);
    auto in = tensor_view::of(std::span(five));
    auto r = fn->forward(in, tensor_view::of(std::span(six)), {5s}).wait(1s);
    if (r || r.error().code() != errc::invalid_argument) return "a 5-element input was accepted";
    if (r.error().message().find("input has 5 elements, expected 6") == std::string::npos)
      return "the forward message does not name both counts: " + r.error().to_string();
    // Backward sends with the receive counts (6) and receives with the send counts (6):
    // a 7-element grad_input is refused.
    auto b = fn->backward(tensor_view::of(std::span(six)), tensor_view::of(std::span(seven)), {5s})
                 .wait(1s);
    if (b || b.error().code() != errc::invalid_argument) return "a 7-element grad_input accepted";
    if (b.error().message().find("grad_input has 7 elements, expected 6") == std::string::npos)
      return "the backward message does not name both counts: " + b.error().to_string();
    std::vector<double> dbl(6);
    auto d = fn->forward(tensor_view::of(std::span(six)), tensor_view::of(std::span(dbl)), {5s})
                 .wait(1s);
    if (d || d.error().code() != errc::invalid_argument) return "mixed dtypes were accepted";
    autograd_all_to_all eq(gp);
    auto e = eq.forward(tensor_view::of(std::span(seven)), tensor_view::of(std::span(seven)), {5s})
                 .wait(1s);
    if (e || e.error().message().find("multiple of the group size 3") == std::string::npos)
      return "7 elements over 3 equal splits were accepted";
    // The group is not broken by refused arguments.
    auto bar = g.barrier({5s}).wait(10s);
    return bar ? std::string() : "barrier after refusals: " + bar.error().to_string();
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("a float sum is folded in rank order, bit for bit the same on every rank") {
  // Values whose sums round differently in another order; sizes for the one-step
  // exchange, the pipelined path, and a pipeline long enough to reuse its receive slots.
  // Two ranks take the one-step exchange at every one of these sizes.
  auto value = [](int rank, std::size_t k) {
    return static_cast<float>(std::sin(0.001 * static_cast<double>(k) + rank) * 1000.0 +
                              0.1 * rank);
  };
  for (const int ranks : {2, 3}) {
    CAPTURE(ranks);
    auto out = on_ranks(ranks, [&](process_group& g) -> std::string {
      for (std::size_t n : {std::size_t{1000}, std::size_t{3 * 131072 + 7}, std::size_t{2621451}}) {
        std::vector<float> f(n);
        for (std::size_t k = 0; k < n; ++k) f[k] = value(g.rank(), k);
        if (auto r = g.allreduce(tensor_view::of(std::span(f)), {reduce_op::sum, 20s}).wait(25s);
            !r)
          return r.error().to_string();
        for (std::size_t k = 0; k < n; ++k) {
          float want = value(0, k);
          for (int r = 1; r < g.size(); ++r) want = want + value(r, k);
          if (std::memcmp(&f[k], &want, sizeof want) != 0)
            return "sum differs from the rank-order fold at " + std::to_string(k) + " of " +
                   std::to_string(n);
        }
      }
      return "";
    });
    for (auto& m : out) CHECK(m == "");
  }
}

TEST_CASE("large allreduces split unevenly over three ranks give every rank the exact result") {
  // Above the one-step exchange: reduce-scatter and allgather in segments, with blocks
  // and last segments of unequal length.
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    const double w = g.size();
    for (std::size_t n : {std::size_t{70000}, std::size_t{3 * 131072 + 7}, std::size_t{1 << 20}}) {
      std::vector<float> f(n);
      std::vector<std::int64_t> i64(n);
      std::vector<double> d(n);
      for (std::size_t k = 0; k < n; ++k) {
        f[k] = static_cast<float>((k % 97) * static_cast<std::size_t>(g.rank() + 1));
        i64[k] = static_cast<std::int64_t>(k) * (g.rank() + 1);
        d[k] = static_cast<double>(k % 13) * (g.rank() + 1);
      }
      if (auto r = g.allreduce(tensor_view::of(std::span(f)), {reduce_op::sum, 10s}).wait(15s); !r)
        return r.error().to_string();
      if (auto r = g.allreduce(tensor_view::of(std::span(i64)), {reduce_op::max, 10s}).wait(15s);
          !r)
        return r.error().to_string();
      if (auto r = g.allreduce(tensor_view::of(std::span(d)), {reduce_op::avg, 10s}).wait(15s); !r)
        return r.error().to_string();
      const double sum_of_factors = w * (w + 1) / 2;  // 1 + 2 + ... + size
      for (std::size_t k = 0; k < n; ++k) {
        if (f[k] != static_cast<float>((k % 97) * sum_of_factors))
          return "float sum wrong at " + std::to_string(k) + " of " + std::to_string(n);
        if (i64[k] != static_cast<std::int64_t>(k) * g.size())
          return "int64 max wrong at " + std::to_string(k) + " of " + std::to_string(n);
        if (d[k] != static_cast<double>(k % 13) * sum_of_factors / w)
          return "float64 avg wrong at " + std::to_string(k) + " of " + std::to_string(n);
      }
    }
    return "";
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("collectives waited for out of order run in call order and give the right results") {
  auto out = on_ranks(3, [](process_group& g) -> std::string {
    double a = g.rank() + 1.0, b = g.rank() == 1 ? 42.0 : 0.0, c = 10.0 * (g.rank() + 1);
    auto wa = g.allreduce(tensor_view{&a, dtype::float64, 1, device::cpu()}, {reduce_op::sum, 5s});
    auto wb = g.broadcast(tensor_view{&b, dtype::float64, 1, device::cpu()}, {1, 5s});
    auto wc = g.allreduce(tensor_view{&c, dtype::float64, 1, device::cpu()}, {reduce_op::max, 5s});
    for (auto* w : {&wc, &wa, &wb})
      if (auto r = w->wait(10s); !r) return r.error().to_string();
    if (a != 6.0 || b != 42.0 || c != 30.0)
      return "results " + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c);
    return {};
  });
  for (auto& m : out) CHECK(m == "");
}

TEST_CASE("a collective whose waiter finds it next in line may run on the waiting thread") {
  // The work completes on the thread that ran it (its continuations run there), so the
  // continuation's thread tells who ran it. The group's worker may win the race for any one
  // operation; over many, the waiter takes some of them itself.
  auto out = on_ranks(2, [](process_group& g) -> std::string {
    int inline_runs = 0, checked = 0;
    const auto me = std::this_thread::get_id();
    // 1000 rather than 200: on a loaded machine the worker once won all of 200.
    for (int i = 0; i < 1000; ++i) {
      float x = 1.0f;
      auto w = g.allreduce(tensor_view{&x, dtype::float32, 1, device::cpu()}, {reduce_op::sum, 5s});
      // Done before the continuation is attached: it would run here, telling nothing.
      if (w.is_completed()) continue;
      auto ran_on = w.get_future().then([] { return std::this_thread::get_id(); });
      if (auto r = w.wait(10s); !r) return r.error().to_string();
      auto id = ran_on.get(10s);
      if (!id) return id.error().to_string();
      if (x != 2.0f) return "allreduce " + std::to_string(i) + " gave " + std::to_string(x);
      inline_runs += *id == me;
      ++checked;
    }
    return inline_runs > 0 ? std::string()
                           : "the waiter ran none of the " + std::to_string(checked) +
                                 " operations still running when it waited";
  });
  for (auto& m : out) CHECK(m == "");
}

namespace {

// Two ranks run `waited_first` allreduces, each waited for at once, then one more that
// rank 0 does not touch until rank 1 got its result. What each rank reports ("" if all
// went well) and how long rank 1 waited for that last one.
struct unwaited_outcome {
  std::vector<std::string> out;
  std::chrono::microseconds peer_waited{};
};
unwaited_outcome allreduce_nobody_waits_for(int waited_first) {
  std::atomic<bool> peer_done{false};
  std::atomic<long long> peer_waited_us{0};
  auto out = on_ranks(2, [&](process_group& g) -> std::string {
    for (int i = 0; i < waited_first; ++i) {
      float y = 1.0f;
      auto w = g.allreduce(tensor_view{&y, dtype::float32, 1, device::cpu()}, {reduce_op::sum, 5s});
      if (auto r = w.wait(10s); !r) return r.error().to_string();
    }
    float x = 1.0f;
    auto w = g.allreduce(tensor_view{&x, dtype::float32, 1, device::cpu()}, {reduce_op::sum, 5s});
    if (g.rank() == 1) {
      const auto start = std::chrono::steady_clock::now();
      auto r = w.wait(5s);
      peer_waited_us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      peer_done = true;
      if (!r) return r.error().to_string();
    } else {
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (!peer_done && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      if (!peer_done) return "rank 1 was held up waiting for rank 0, which never waited";
      if (auto r = w.wait(5s); !r) return r.error().to_string();
    }
    return x == 2.0f ? std::string() : "allreduce gave " + std::to_string(x);
  });
  return {std::move(out), std::chrono::microseconds(peer_waited_us.load())};
}

}  // namespace

TEST_CASE(
    "a small collective that its caller never waits for still runs, so a peer that waits is not "
    "held up") {
  // The group holds a small collective back a moment for its waiter; with no waiter, its
  // worker must start it by itself.
  for (auto& m : allreduce_nobody_waits_for(0).out) CHECK(m == "");
}

TEST_CASE(
    "after a long run of collectives their callers ran themselves, one that nobody waits for "
    "still starts by itself soon after its grace") {
  // The worker looks for held collectives less often once the waiters run them (every few
  // milliseconds instead of every grace): a collective that nobody waits for then starts
  // a little later, but starts.
  auto got = allreduce_nobody_waits_for(300);
  for (auto& m : got.out) CHECK(m == "");
  // Its grace (0.5 ms) and one slow look (5 ms), with room for a loaded machine; the
  // store's timeout (5 s) is what a worker that never looked would give.
  CHECK(got.peer_waited < 1s);
}
