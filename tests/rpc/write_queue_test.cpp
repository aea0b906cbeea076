// A connection's send queue: one-way calls combined into batches, order kept with the
// requests between them, backpressure on a full queue, nothing lost at shutdown; and on
// the receiving side, work deferred to the end of a read batch.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <troupe/core/metrics.hpp>
#include "group_fixture.hpp"

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::testing;
using namespace std::chrono_literals;

namespace {

// Per sending thread, the sequence numbers in the order the callee ran them.
struct recorder {
  std::mutex mu;
  std::vector<std::vector<int>> seen;
  explicit recorder(int threads) : seen(static_cast<std::size_t>(threads)) {}
};

std::shared_ptr<function_table> recording_functions(const std::shared_ptr<recorder>& rec) {
  auto fns = standard_functions();
  REQUIRE(fns->add(
      "record",
      [rec](int thread, int seq) {
        std::lock_guard lk(rec->mu);
        rec->seen[static_cast<std::size_t>(thread)].push_back(seq);
      },
      function_options{true}));
  REQUIRE(fns->add(
      "seen",
      [rec](int thread) {
        std::lock_guard lk(rec->mu);
        return static_cast<int>(rec->seen[static_cast<std::size_t>(thread)].size());
      },
      function_options{true}));
  return fns;
}

}  // namespace

TEST_CASE(
    "combined one-way calls keep their order with requests sent between them, from several "
    "threads") {
  constexpr int threads = 4;
  constexpr int per_thread = 2000;
  auto rec = std::make_shared<recorder>(threads);
  auto fns = recording_functions(rec);
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  std::atomic<int> wrong_counts{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      call_options now;
      now.combine_writes = false;
      for (int i = 0; i < per_thread; ++i) {
        // Mostly combined writes, some written at once: both share one queue.
        auto f = g[0]->notify(i % 7 == 0 ? now : call_options{}, "w1", "record", t, i);
        if (!f.get(5s)) ++failures;
        if (i % 100 == 99) {
          // A request goes out behind every one-way call this thread queued before it.
          auto n = g[0]->rpc_sync<int>("w1", "seen", t);
          if (!n || *n != i + 1) ++wrong_counts;
        }
      }
    });
  for (auto& th : ts) th.join();
  CHECK(failures == 0);
  CHECK(wrong_counts == 0);
  {
    std::lock_guard lk(rec->mu);
    for (int t = 0; t < threads; ++t) {
      const auto& s = rec->seen[static_cast<std::size_t>(t)];
      REQUIRE(s.size() == static_cast<std::size_t>(per_thread));
      bool in_order = true;
      for (int i = 0; i < per_thread; ++i)
        in_order = in_order && s[static_cast<std::size_t>(i)] == i;
      CHECK_MESSAGE(in_order, "thread ", t, "'s one-way calls ran out of order");
    }
  }
  shutdown_all(g);
}

TEST_CASE(
    "a sender that finds the send queue full waits until the call's timeout, then gets a clear "
    "error") {
  auto sunk = std::make_shared<std::atomic<int>>(0);
  auto fns = standard_functions();
  // Runs on the callee's only I/O thread: while it sleeps, nothing is read there.
  REQUIRE(fns->add(
      "stall", [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); },
      function_options{true}));
  REQUIRE(fns->add(
      "sink", [sunk](tensor) { ++*sunk; }, function_options{true}));
  auto g = make_group(2, std::make_shared<memory_store>(), [&](int, rpc_backend_options& o) {
    o.functions = fns;
    o.max_queued_bytes = 256 * 1024;
  });
  std::vector<float> data(1 << 18);  // 1 MiB
  auto t = tensor::from<float>(data, dtype::float32);
  REQUIRE(g[0]->notify("w1", "stall", 2000).get(5s));
  call_options o;
  o.timeout = 200ms;
  std::optional<error> refused;
  int sent = 0;
  clock::duration refused_after{};
  for (int i = 0; i < 200 && !refused; ++i) {
    auto t0 = clock::now();
    auto r = g[0]->notify(o, "w1", "sink", t).get(5s);
    if (r) {
      ++sent;
    } else {
      refused = r.error();
      refused_after = clock::now() - t0;
    }
  }
  REQUIRE_MESSAGE(refused, "200 MiB were queued to a receiver that reads nothing");
  CHECK(refused->code() == errc::timeout);
  CHECK(refused->message().find("send queue to worker 'w1'") != std::string::npos);
  CHECK(refused->worker() == "w1");
  CHECK(refused_after >= 150ms);
  CHECK(refused_after < 1500ms);
  // Once the receiver reads again, everything queued before arrives and calls work.
  auto sum = g[0]->rpc_sync<int>("w1", "add", 2, 3);
  REQUIRE_MESSAGE(sum, (sum ? "" : sum.error().to_string()));
  CHECK(*sum == 5);
  CHECK(sunk->load() == sent);
  shutdown_all(g);
}

TEST_CASE(
    "the send-queue gauge shows the bytes waiting behind a stalled receiver, and zero once they "
    "are written") {
  auto& queued = metrics::get_gauge("troupe_rpc_send_queue_bytes", "");
  auto sunk = std::make_shared<std::atomic<int>>(0);
  auto fns = standard_functions();
  REQUIRE(fns->add(
      "stall", [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); },
      function_options{true}));
  REQUIRE(fns->add(
      "sink", [sunk](tensor) { ++*sunk; }, function_options{true}));
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  // The group's own first frames may still be queued when it is made (68 bytes were, on a
  // loaded machine): they drain at once.
  for (auto settle = clock::now() + 1s; queued.value() != 0 && clock::now() < settle;)
    std::this_thread::sleep_for(1ms);
  CHECK(queued.value() == 0);
  std::vector<float> data(1 << 18);  // 1 MiB each, 16 MiB in all: more than the kernel buffers
  auto t = tensor::from<float>(data, dtype::float32);
  REQUIRE(g[0]->notify("w1", "stall", 1500).get(5s));
  constexpr int n = 16;
  for (int i = 0; i < n; ++i) REQUIRE(g[0]->notify("w1", "sink", t).get(5s));
  // The sweeper samples the queues every 5 ms; several MiB cannot have left yet.
  auto until = clock::now() + 1s;
  while (queued.value() < (4 << 20) && clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(queued.value() >= (4 << 20));
  CHECK(queued.value() <= n * (1 << 20) + (1 << 20));
  // Once the receiver reads again, the queue drains and the gauge follows.
  until = clock::now() + 10s;
  while ((sunk->load() < n || queued.value() != 0) && clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(sunk->load() == n);
  CHECK(queued.value() == 0);
  shutdown_all(g);
  CHECK(queued.value() == 0);
}

TEST_CASE(
    "one-way calls still queued behind a slow receiver at shutdown are delivered before the agent "
    "stops") {
  auto sunk = std::make_shared<std::atomic<int>>(0);
  auto fns = standard_functions();
  REQUIRE(fns->add(
      "stall", [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); },
      function_options{true}));
  REQUIRE(fns->add(
      "sink", [sunk](tensor) { ++*sunk; }, function_options{true}));
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  std::vector<float> data(1 << 16);  // 256 KiB each, 32 MiB in all: more than the kernel buffers
  auto t = tensor::from<float>(data, dtype::float32);
  REQUIRE(g[0]->notify("w1", "stall", 500).get(5s));
  constexpr int n = 128;
  for (int i = 0; i < n; ++i) REQUIRE(g[0]->notify("w1", "sink", t).get(5s));
  shutdown_all(g);
  CHECK(sunk->load() == n);
}

TEST_CASE("work deferred to the end of a read batch runs once, after every call of that read") {
  CHECK_FALSE(at_end_of_read_batch([] {}));  // not on an I/O thread
  struct state {
    std::mutex mu;
    int calls = 0;
    int hooks_run = 0;
    int hooks_registered = 0;
    int wrong = 0;    // a hook that ran before its own call, twice, or elsewhere
    int batched = 0;  // hooks that saw later calls of their read before running
  };
  auto st = std::make_shared<state>();
  auto fns = standard_functions();
  REQUIRE(fns->add(
      "tick",
      [st](int) {
        int at;
        {
          std::lock_guard lk(st->mu);
          at = ++st->calls;
        }
        auto ran = std::make_shared<bool>(false);
        auto me = std::this_thread::get_id();
        bool ok = at_end_of_read_batch([st, at, ran, me] {
          std::lock_guard lk(st->mu);
          if (*ran || st->calls < at || std::this_thread::get_id() != me) ++st->wrong;
          *ran = true;
          ++st->hooks_run;
          if (st->calls > at) ++st->batched;
        });
        std::lock_guard lk(st->mu);
        if (ok)
          ++st->hooks_registered;
        else
          ++st->wrong;
      },
      function_options{true}));
  auto g = make_group(2, std::make_shared<memory_store>(),
                      [&](int, rpc_backend_options& o) { o.functions = fns; });
  constexpr int n = 5000;
  for (int i = 0; i < n; ++i) REQUIRE(g[0]->notify("w1", "tick", i).get(5s));
  REQUIRE(g[0]->rpc_sync<int>("w1", "add", 1, 1));  // after every tick
  // The answer to "add" can leave (from a pool thread) before the I/O thread ends the read
  // that brought it and the last ticks, and runs their deferred work.
  for (auto until = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < until;) {
    {
      std::lock_guard lk(st->mu);
      if (st->hooks_run >= n) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  {
    std::lock_guard lk(st->mu);
    CHECK(st->calls == n);
    CHECK(st->hooks_registered == n);
    CHECK(st->hooks_run == n);
    CHECK(st->wrong == 0);
    CHECK(st->batched > 0);  // combined writes arrive several calls to a read
  }
  shutdown_all(g);
}
