// Concurrency tests for future/promise; this suite also runs under ThreadSanitizer.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include <troupe/core/future.hpp>

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("a value set on another thread wakes a waiting get") {
  promise<int> p;
  auto f = p.get_future();
  std::thread t([&] {
    std::this_thread::sleep_for(5ms);
    p.set_value(11);
  });
  auto r = f.get(5s);
  t.join();
  REQUIRE(r);
  CHECK(*r == 11);
}

TEST_CASE("racing setters: exactly one wins and the continuation runs once") {
  for (int round = 0; round < 200; ++round) {
    promise<int> p;
    std::atomic<int> runs{0};
    std::atomic<int> wins{0};
    auto f = p.get_future().then([&](int x) {
      runs.fetch_add(1);
      return x;
    });
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&, i] {
        if (p.set_value(i)) wins.fetch_add(1);
      });
    for (auto& t : ts) t.join();
    auto r = f.get(5s);
    REQUIRE(r);
    CHECK(wins.load() == 1);
    CHECK(runs.load() == 1);
  }
}

TEST_CASE("attaching a continuation races safely with completion") {
  for (int round = 0; round < 500; ++round) {
    promise<int> p;
    auto f = p.get_future();
    std::atomic<int> seen{0};
    std::thread setter([&] { p.set_value(round); });
    auto g = std::move(f).then([&](int x) {
      seen.store(x + 1);
      return x;
    });
    setter.join();
    auto r = g.get(5s);
    REQUIRE(r);
    CHECK(*r == round);
    CHECK(seen.load() == round + 1);
  }
}

TEST_CASE("when_all collects results set from many threads") {
  constexpr int n = 32;
  std::vector<promise<int>> ps(n);
  std::vector<future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto all = when_all(std::move(fs));
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] { ps[static_cast<std::size_t>(i)].set_value(i); });
  for (auto& t : ts) t.join();
  auto r = all.get(5s);
  REQUIRE(r);
  for (int i = 0; i < n; ++i) CHECK((*r)[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("many waiters on independent futures time out without waking each other") {
  std::vector<std::thread> ts;
  std::atomic<int> timeouts{0};
  std::vector<promise<int>> ps(8);
  std::vector<future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  for (auto& f : fs)
    ts.emplace_back([&] {
      auto r = f.get(20ms);
      if (!r && r.error().code() == errc::timeout) timeouts.fetch_add(1);
    });
  for (auto& t : ts) t.join();
  CHECK(timeouts.load() == 8);
}
