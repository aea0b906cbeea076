// all_gather, the reusable barrier and the membership token, with threads as ranks.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include <troupe/store/membership_token.hpp>
#include <troupe/store/memory_store.hpp>
#include <troupe/store/rendezvous.hpp>
#include <troupe/store/tcp_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::errc;

// Runs fn(rank) on world_size threads and joins them.
template <class F>
void run_ranks(int world_size, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("all_gather returns every rank's value in rank order") {
  troupe::memory_store s;
  constexpr int world = 8;
  std::vector<troupe::expected<std::vector<troupe::bytes>>> results(world);
  run_ranks(world, [&](int r) {
    results[static_cast<std::size_t>(r)] =
        troupe::all_gather(s, "gather/0", r, world, troupe::to_bytes("v" + std::to_string(r)), 5s);
  });
  for (const auto& res : results) {
    REQUIRE(res.has_value());
    REQUIRE(res->size() == world);
    for (int r = 0; r < world; ++r)
      CHECK(troupe::to_string((*res)[static_cast<std::size_t>(r)]) == "v" + std::to_string(r));
  }
}

TEST_CASE("all_gather times out naming the ranks that never published") {
  troupe::memory_store s;
  auto r = troupe::all_gather(s, "gather/lonely", 1, 3, troupe::to_bytes("x"), 100ms);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::timeout);
  CHECK(r.error().message().find("ranks 0 and 2") != std::string::npos);
}

TEST_CASE("all_gather rejects a rank outside the world") {
  troupe::memory_store s;
  auto r = troupe::all_gather(s, "g", 3, 3, troupe::to_bytes("x"), 100ms);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::invalid_argument);
}

TEST_CASE("a barrier with one name can be passed many times in a row") {
  troupe::memory_store s;
  constexpr int world = 4;
  constexpr int rounds = 20;
  std::atomic<int> entered{0};
  std::atomic<int> errors{0};
  run_ranks(world, [&](int r) {
    for (int i = 0; i < rounds; ++i) {
      entered.fetch_add(1);
      if (!troupe::barrier(s, "step", r, world, 5s)) errors++;
      // Nobody leaves round i before all have entered it.
      if (entered.load() < (i + 1) * world) errors++;
    }
  });
  CHECK(errors.load() == 0);
  // Old generations are cleared: only the counter and the last two rounds' keys remain.
  CHECK(s.num_keys_with_prefix("step/", 1s).value() <= 1 + 2 * (world + 1));
}

TEST_CASE("a barrier timeout names the ranks that did not arrive") {
  troupe::memory_store s;
  std::vector<troupe::expected<void>> results(2);
  std::thread a([&] { results[0] = troupe::barrier(s, "partial", 0, 4, 300ms); });
  std::thread c([&] { results[1] = troupe::barrier(s, "partial", 2, 4, 300ms); });
  a.join();
  c.join();
  for (const auto& r : results) {
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::timeout);
    CHECK(r.error().message().find("ranks 1 and 3 did not arrive") != std::string::npos);
  }
}

TEST_CASE("the membership token admits one holder at a time") {
  troupe::memory_store s;
  std::atomic<int> inside{0};
  std::atomic<int> most_inside{0};
  std::atomic<int> done{0};
  std::atomic<int> errors{0};
  troupe::membership_token_options o;
  o.ttl = 5s;
  run_ranks(6, [&](int r) {
    auto guard =
        troupe::acquire_membership_token(s, "group/token", "w" + std::to_string(r), 10s, o);
    if (!guard) {
      errors++;
      return;
    }
    int now = inside.fetch_add(1) + 1;
    int seen = most_inside.load();
    while (now > seen && !most_inside.compare_exchange_weak(seen, now)) {
    }
    // Some store traffic while holding it, as a join would do.
    for (int i = 0; i < 20; ++i) (void)s.add("group/size", 1);
    if (!guard->held()) errors++;
    inside.fetch_sub(1);
    if (!guard->release()) errors++;
    done++;
  });
  CHECK(errors.load() == 0);
  CHECK(done.load() == 6);
  CHECK(most_inside.load() == 1);
}

TEST_CASE("a waiter takes the membership token over from a holder that stopped refreshing") {
  troupe::memory_store s;
  // A record as a holder writes it, from a holder that has died: nobody refreshes it.
  REQUIRE(s.set("tok", std::string_view("held 1a2b 3 300 dead-worker")));
  auto start = std::chrono::steady_clock::now();
  auto guard = troupe::acquire_membership_token(s, "tok", "survivor", 5s);
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(guard.has_value());
  CHECK(guard->held());
  CHECK(took >= 300ms);
  CHECK(took < 3s);
  CHECK(troupe::to_string(s.get("tok").value()).find("survivor") != std::string::npos);
}

TEST_CASE("a released membership token passes to a waiter long before the ttl") {
  troupe::memory_store s;
  troupe::membership_token_options o;
  o.ttl = 60s;
  auto first = troupe::acquire_membership_token(s, "tok", "first", 1s, o);
  REQUIRE(first.has_value());
  troupe::expected<troupe::membership_guard> second = troupe::make_error(errc::internal, "not run");
  auto start = std::chrono::steady_clock::now();
  std::thread waiter(
      [&] { second = troupe::acquire_membership_token(s, "tok", "second", 10s, o); });
  REQUIRE(first->release());
  CHECK_FALSE(first->held());
  waiter.join();
  REQUIRE(second.has_value());
  CHECK(second->held());
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("acquiring a held membership token times out naming the holder") {
  troupe::memory_store s;
  auto holder = troupe::acquire_membership_token(s, "tok", "busy-worker", 1s);
  REQUIRE(holder.has_value());
  auto other = troupe::acquire_membership_token(s, "tok", "other", 150ms);
  REQUIRE_FALSE(other.has_value());
  CHECK(other.error().code() == errc::timeout);
  CHECK(other.error().message().find("busy-worker") != std::string::npos);
}

TEST_CASE("a key that holds something else is not taken for a membership token") {
  troupe::memory_store s;
  REQUIRE(s.set("tok", std::string_view("not a record")));
  auto g = troupe::acquire_membership_token(s, "tok", "w", 1s);
  REQUIRE_FALSE(g.has_value());
  CHECK(g.error().code() == errc::invalid_argument);
}

TEST_CASE("the rendezvous helpers work through tcp store clients") {
  auto server = troupe::tcp_store_server::start({}).value();
  constexpr int world = 6;
  std::atomic<int> errors{0};
  run_ranks(world, [&](int r) {
    troupe::tcp_store_options o;
    o.port = server->port();
    o.connect_timeout = 5s;
    auto c = troupe::tcp_store::connect(o);
    if (!c) {
      errors++;
      return;
    }
    auto& s = **c;
    auto all = troupe::all_gather(s, "names", r, world, troupe::to_bytes(std::to_string(r)), 10s);
    if (!all || all->size() != world) errors++;
    for (int i = 0; i < 3; ++i)
      if (!troupe::barrier(s, "b", r, world, 10s)) errors++;
    troupe::membership_token_options o2;
    o2.ttl = 5s;
    auto g = troupe::acquire_membership_token(s, "tok", std::to_string(r), 20s, o2);
    if (!g) errors++;
  });
  CHECK(errors.load() == 0);
}
