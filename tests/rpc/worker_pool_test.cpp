// The worker pool and its spin policy on their own: when a waiting thread spins, and that
// no task is lost or delayed behind the spinning thread.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <troupe/rpc/detail/spin_policy.hpp>
#include <troupe/rpc/detail/worker_pool.hpp>

using namespace std::chrono_literals;
using troupe::deadline;
using troupe::rpc::detail::spin_policy;
using troupe::rpc::detail::worker_pool;

TEST_CASE("a spin policy with no budget never spins") {
  spin_policy p(0us);
  CHECK(p.grant() == 0ns);
  for (int i = 0; i < 20; ++i) p.record(1us);
  CHECK(p.grant() == 0ns);
}

TEST_CASE("a spin policy spins at first and while waits stay short") {
  spin_policy p(50us);
  CHECK(p.grant() == 50us);
  for (int i = 0; i < 100; ++i) p.record(180us);  // under four budgets
  CHECK(p.grant() == 50us);
}

TEST_CASE("a spin policy stops spinning after a run of long waits and resumes after short ones") {
  spin_policy p(50us);
  int long_waits = 0;
  while (p.grant() != 0ns && long_waits < 100) {
    p.record(10ms);
    ++long_waits;
  }
  CHECK(p.grant() == 0ns);
  CHECK(long_waits > 1);  // one slow call alone does not turn it off
  CHECK(long_waits <= 10);
  int short_waits = 0;
  while (p.grant() == 0ns && short_waits < 100) {
    p.record(100us);  // what a round trip takes when neither end spins
    ++short_waits;
  }
  CHECK(p.grant() == 50us);
  CHECK(short_waits <= 10);  // a very long wait weighs no more than a few budgets
}

TEST_CASE("a pool whose threads spin runs every task, lone or in bursts, without delay") {
  worker_pool pool(4, 200us);
  std::atomic<int> done{0};
  // Lone tasks, each posted once the last ran: the spinning thread takes them.
  for (int i = 0; i < 200; ++i) {
    const int want = done.load() + 1;
    REQUIRE(pool.post([&] { done.fetch_add(1); }));
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (done.load() < want && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    REQUIRE(done.load() == want);
  }
  // A burst of tasks that block until all of them run: they need every thread at once, so
  // a task left to the spinning thread alone would never finish.
  std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i)
    REQUIRE(pool.post([&] {
      started.fetch_add(1);
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (started.load() < 4 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(100us);
    }));
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (started.load() < 4 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(started.load() == 4);
  pool.stop(deadline::after(5s));
  CHECK(done.load() == 200);
}

TEST_CASE("a pool that does not spin runs tasks posted from many threads") {
  worker_pool pool(2, 0us);
  std::atomic<int> done{0};
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t)
    posters.emplace_back([&] {
      for (int i = 0; i < 250; ++i) (void)pool.post([&] { done.fetch_add(1); });
    });
  for (auto& t : posters) t.join();
  pool.stop(deadline::after(5s));
  CHECK(done.load() == 1000);
}
