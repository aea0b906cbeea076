// Agreement on epochs with compare_set, and services in one process, over an in-process
// store (docs/membership.md). The multi-process cases are in multiprocess_test.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <set>
#include <thread>

#include <troupe/membership/service.hpp>
#include <troupe/store/memory_store.hpp>

using namespace troupe::membership;
using namespace std::chrono_literals;
using troupe::errc;

namespace {

member make(const std::string& name) {
  member m;
  m.name = name;
  m.host = "here";
  m.pid = 1;
  m.incarnation = name + "-1";
  return m;
}

epoch_change join_of(const std::string& name) {
  epoch_change c;
  c.add.push_back(make(name));
  c.cause = "joined " + name;
  return c;
}

epoch_change removal_of(const std::string& name) {
  epoch_change c;
  c.remove.push_back({name, {}});
  c.cause = "dead " + name;
  return c;
}

service_options fast(const std::string& name, troupe::duration timeout = 2s) {
  service_options o;
  o.name = name;
  o.host = "here";
  o.heartbeat_timeout = timeout;
  o.heartbeat_interval = 50ms;
  o.op_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE(
    "sixteen threads joining at once converge on one epoch of sixteen with a history of one join "
    "per epoch") {
  troupe::memory_store s;
  constexpr int n = 16;
  std::barrier start(n);
  std::vector<std::thread> threads;
  std::vector<troupe::expected<epoch>> results(n, epoch{});
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      results[static_cast<std::size_t>(i)] = apply_change(s, join_of("w" + std::to_string(i)), 20s);
    });
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    REQUIRE(r.has_value());
    CHECK(r->size() >= 1);
  }
  auto final_epoch = read_epoch(s, 5s);
  REQUIRE(final_epoch.has_value());
  CHECK(final_epoch->number == n);
  CHECK(final_epoch->size() == n);
  std::set<std::string> names;
  for (const auto& m : final_epoch->members) names.insert(m.name);
  CHECK(names.size() == n);
  // Every epoch of the history adds exactly one member to the one before.
  epoch before;
  for (std::uint64_t k = 1; k <= n; ++k) {
    auto e = read_epoch(s, k, 1s);
    REQUIRE(e.has_value());
    CHECK(e->number == k);
    REQUIRE(e->size() == before.size() + 1);
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(e->members[i] == before.members[i]);
    before = *e;
  }
}

TEST_CASE("many threads declaring the same member dead at once make exactly one epoch") {
  troupe::memory_store s;
  for (const char* name : {"a", "b", "c", "d"}) REQUIRE(apply_change(s, join_of(name), 5s));
  constexpr int n = 12;
  std::barrier start(n);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&] {
      start.arrive_and_wait();
      auto r = apply_change(s, removal_of("c"), 20s);
      if (!r || r->contains("c")) ++failures;
    });
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  auto e = read_epoch(s, 5s);
  REQUIRE(e.has_value());
  CHECK(e->number == 5);
  CHECK(e->names() == "a,b,d");
}

TEST_CASE(
    "two deaths and a join proposed at once settle on one epoch that lacks both and holds the "
    "joiner") {
  for (int trial = 0; trial < 30; ++trial) {
    CAPTURE(trial);
    troupe::memory_store s;
    for (const char* name : {"a", "b", "c", "d"}) REQUIRE(apply_change(s, join_of(name), 5s));
    std::barrier start(3);
    std::vector<epoch_change> changes{removal_of("b"), removal_of("d"), join_of("e")};
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (auto& c : changes)
      threads.emplace_back([&, c] {
        start.arrive_and_wait();
        if (!apply_change(s, c, 20s)) ++failures;
      });
    for (auto& t : threads) t.join();
    CHECK(failures == 0);
    auto e = read_epoch(s, 5s);
    REQUIRE(e.has_value());
    CHECK(e->number == 7);
    CHECK(e->names() == "a,c,e");
    CHECK(e->find("e")->rank == 2);
  }
}

TEST_CASE(
    "services in one process see the same epochs in order and one that leaves is removed from "
    "all") {
  // Declared before the services, which call back into them until they shut down.
  std::vector<std::uint64_t> seen_by_a;
  std::mutex mu;
  auto s = std::make_shared<troupe::memory_store>();
  auto a = service::join(s, fast("a"), 5s);
  REQUIRE(a.has_value());
  (*a)->on_epoch([&](const epoch& before, const epoch& after) {
    std::lock_guard lk(mu);
    if (after.number == before.number + 1) seen_by_a.push_back(after.number);
  });
  auto b = service::join(s, fast("b"), 5s);
  REQUIRE(b.has_value());
  auto c = service::join(s, fast("c"), 5s);
  REQUIRE(c.has_value());
  CHECK((*c)->self().rank == 2);
  for (auto* svc : {&*a, &*b, &*c}) {
    auto e = (*svc)->wait_for_epoch(3, 5s);
    REQUIRE(e.has_value());
    CHECK(e->names() == "a,b,c");
  }
  REQUIRE((*b)->shutdown(5s));
  CHECK((*b)->shutdown(5s));  // idempotent
  for (auto* svc : {&*a, &*c}) {
    auto e = (*svc)->wait_for_epoch(4, 5s);
    REQUIRE(e.has_value());
    CHECK(e->names() == "a,c");
    CHECK(e->cause.find("left: b (rank 1") != std::string::npos);
    CHECK((*svc)->health());
  }
  CHECK((*c)->rank() == 1);
  // The watcher makes an epoch current before it calls the callbacks: wait (bounded) for
  // the callback of epoch 4 too.
  for (auto until = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < until;) {
    {
      std::lock_guard lk(mu);
      if (!seen_by_a.empty() && seen_by_a.back() >= 4) break;
    }
    std::this_thread::sleep_for(2ms);
  }
  {
    std::lock_guard lk(mu);
    CHECK(seen_by_a == std::vector<std::uint64_t>{2, 3, 4});
  }
  auto late = (*a)->wait_for_epoch(9, 200ms);
  REQUIRE_FALSE(late.has_value());
  CHECK(late.error().code() == errc::timeout);
}

TEST_CASE(
    "a member whose heartbeat never advances is declared dead within the timeout, naming it") {
  auto s = std::make_shared<troupe::memory_store>();
  // A member that joined but never beats: as a process stopped right after joining.
  member ghost = make("ghost");
  ghost.host = "far";
  ghost.pid = 4242;
  epoch_change c;
  c.add.push_back(ghost);
  c.cause = "joined ghost";
  REQUIRE(apply_change(*s, c, 5s));
  const auto start = std::chrono::steady_clock::now();
  auto a = service::join(s, fast("a", 400ms), 5s);
  REQUIRE(a.has_value());
  CHECK((*a)->self().rank == 1);
  auto e = (*a)->wait_until([](const epoch& x) { return !x.contains("ghost"); }, 10s);
  REQUIRE(e.has_value());
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 400ms);
  CHECK(took < 5s);
  CHECK(e->names() == "a");
  CHECK((*a)->rank() == 0);
  CAPTURE(e->cause);
  CHECK(e->cause.find("ghost (rank 0, host far, pid 4242): heartbeat silent") != std::string::npos);
}

TEST_CASE("a live member is never declared dead while it beats") {
  auto s = std::make_shared<troupe::memory_store>();
  auto a = service::join(s, fast("a", 300ms), 5s);
  auto b = service::join(s, fast("b", 300ms), 5s);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE((*a)->wait_for_epoch(2, 5s));
  REQUIRE((*b)->wait_for_epoch(2, 5s));
  // Ten timeouts long: nobody leaves.
  auto e = (*a)->wait_until([](const epoch& x) { return x.size() != 2; }, 3s);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == errc::timeout);
  CHECK((*a)->current().number == 2);
  CHECK((*b)->current().number == 2);
}

TEST_CASE(
    "a member left out of an epoch fails its health with membership_changed naming the epoch") {
  auto s = std::make_shared<troupe::memory_store>();
  auto a = service::join(s, fast("a"), 5s);
  auto b = service::join(s, fast("b"), 5s);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  auto r = (*a)->declare_dead("b", "its connection was lost", 5s);
  REQUIRE(r.has_value());
  CHECK(r->names() == "a");
  CHECK(r->cause.find("b (rank 1, host here") != std::string::npos);
  CHECK(r->cause.find("its connection was lost") != std::string::npos);
  auto out = (*b)->wait_for_epoch(3, 5s);
  REQUIRE(out.has_value());
  auto h = (*b)->health();
  REQUIRE_FALSE(h.has_value());
  CHECK(h.error().code() == errc::membership_changed);
  CHECK(h.error().message().find("is not in epoch 3") != std::string::npos);
  CHECK((*b)->rank() == -1);
  // Declaring a member that is already out changes nothing.
  auto again = (*a)->declare_dead("b", "again", 5s);
  REQUIRE(again.has_value());
  CHECK(again->number == 3);
}

TEST_CASE("a second member with a name already in the job is refused") {
  auto s = std::make_shared<troupe::memory_store>();
  auto a = service::join(s, fast("a"), 5s);
  REQUIRE(a.has_value());
  auto twin = service::join(s, fast("a"), 5s);
  REQUIRE_FALSE(twin.has_value());
  CHECK(twin.error().code() == errc::already_exists);
  auto bad = service::join(s, fast("has space"), 5s);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == errc::invalid_argument);
}
