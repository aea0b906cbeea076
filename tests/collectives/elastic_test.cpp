// Elastic groups in one process: members as threads over an in-process store, and the store
// decorator that lets a newer epoch end a build. The multi-process cases (deaths, joins,
// SIGSTOP) are in elastic_multiprocess_test.cpp.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/collectives/interruptible_store.hpp>
#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include "support/membership_join.hpp"

using namespace std::chrono_literals;
using troupe::test::join_membership;
using namespace troupe;
using namespace troupe::collectives;

TEST_CASE("an interruptible store ends a wait as soon as its condition says so, with that error") {
  auto base = std::make_shared<memory_store>();
  std::atomic<bool> stop{false};
  interruptible_store s(base, [&]() -> std::optional<troupe::error> {
    if (stop.load()) return make_error(errc::membership_changed, "epoch 8 arrived");
    return std::nullopt;
  });
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto r = s.get("never", 30s);
  later.join();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::membership_changed);
  CHECK(r.error().message().find("epoch 8 arrived") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // Keys that appear are read through, and a real timeout names the keys and the wait.
  stop = false;
  REQUIRE(s.set("there", std::string_view("1")));
  CHECK(s.get("there", 1s).has_value());
  const std::string keys[] = {"there", "missing"};
  auto w = s.wait(keys, 300ms);
  REQUIRE_FALSE(w.has_value());
  CHECK(w.error().code() == errc::timeout);
  CHECK(w.error().message().find("'missing'") != std::string::npos);
}

TEST_CASE("an elastic group refuses a missing service, store or name, and an unknown backend") {
  auto s = std::make_shared<memory_store>();
  auto svc = join_membership(s, "solo");
  auto none = elastic_group::make(nullptr, s);
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == errc::invalid_argument);
  CHECK(none.error().message().find("membership service") != std::string::npos);
  auto no_store = elastic_group::make(svc, nullptr);
  REQUIRE_FALSE(no_store.has_value());
  CHECK(no_store.error().code() == errc::invalid_argument);
  elastic_options unnamed;
  unnamed.name.clear();
  auto no_name = elastic_group::make(svc, s, unnamed);
  REQUIRE_FALSE(no_name.has_value());
  CHECK(no_name.error().message().find("name") != std::string::npos);
  elastic_options odd;
  odd.backend = "carrier-pigeon";
  auto bad = elastic_group::make(svc, s, odd);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == errc::not_found);
  CHECK(bad.error().message().find("carrier-pigeon") != std::string::npos);
  CHECK(svc->shutdown(5s));
}

TEST_CASE(
    "two members in threads build their epoch's group, and a leave aborts it and rebuilds at world "
    "1") {
  auto s = std::make_shared<memory_store>();
  auto a = join_membership(s, "a");
  auto b = join_membership(s, "b");
  auto ga = elastic_group::make(a, s);
  auto gb = elastic_group::make(b, s);
  REQUIRE(ga.has_value());
  REQUIRE(gb.has_value());
  // Both know epoch 2 (a, b) once b's join reached a's watcher.
  REQUIRE((*ga)->wait_for_change(1, 10s).has_value());
  std::optional<expected<elastic_group::view>> vb;
  std::thread tb([&] { vb = (*gb)->rebuild(20s); });
  auto va = (*ga)->rebuild(20s);
  tb.join();
  REQUIRE_MESSAGE(va.has_value(), va.error().to_string());
  REQUIRE_MESSAGE(vb->has_value(), vb->error().to_string());
  CHECK(va->epoch.number == 2);
  CHECK(va->group->size() == 2);
  CHECK(va->group->rank() == 0);
  CHECK((**vb).group->rank() == 1);
  CHECK(va->group->name() == "elastic/epoch-2");
  // b leaves while a waits in an allreduce that b never joins.
  std::int32_t x = 5;
  auto pending =
      va->group->allreduce(tensor_view{&x, dtype::int32, 1, device::cpu()}, {reduce_op::sum, 60s});
  (*gb)->shutdown(5s);
  REQUIRE(b->shutdown(5s));
  auto r = pending.wait(20s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::membership_changed);
  CHECK(r.error().message().find("left: b (rank 1, host here") != std::string::npos);
  auto again = (*ga)->rebuild(20s);
  REQUIRE_MESSAGE(again.has_value(), again.error().to_string());
  CHECK(again->epoch.number == 3);
  CHECK(again->group->size() == 1);
  x = 5;
  CHECK(again->group->allreduce(tensor_view{&x, dtype::int32, 1, device::cpu()}, {}).wait(10s));
  CHECK(x == 5);
  // The old group stays aborted: later work on it fails with the same code.
  auto old = va->group->barrier({}).wait(5s);
  REQUIRE_FALSE(old.has_value());
  CHECK(old.error().code() == errc::membership_changed);
  (*ga)->shutdown(5s);
  CHECK(a->shutdown(5s));
}

TEST_CASE("a member that has left cannot rebuild: it is not in the newest epoch") {
  auto s = std::make_shared<memory_store>();
  auto a = join_membership(s, "a");
  auto b = join_membership(s, "b");
  auto gb = elastic_group::make(b, s);
  REQUIRE(gb.has_value());
  // a declares b dead; b's service learns it is out.
  REQUIRE(a->declare_dead("b", "test: b is gone", 10s).has_value());
  REQUIRE((*gb)->wait_for_change(2, 10s).has_value());
  auto r = (*gb)->rebuild(5s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::membership_changed);
  CHECK(r.error().message().find("is not in epoch") != std::string::npos);
  (*gb)->shutdown(5s);
  (void)b->shutdown(5s);
  CHECK(a->shutdown(5s));
}

TEST_CASE("an elastic group erases what its older epochs' builds wrote once a newer one is built") {
  auto s = std::make_shared<memory_store>();
  auto keys_under = [&](const std::string& prefix) {
    return prefix_store(s, prefix).num_keys(5s).value_or(-1);
  };
  auto a = join_membership(s, "a");
  auto ga = elastic_group::make(a, s);
  REQUIRE(ga.has_value());
  auto first = (*ga)->rebuild(20s);  // epoch 1: a alone
  REQUIRE_MESSAGE(first.has_value(), first.error().to_string());
  CHECK(first->epoch.number == 1);
  CHECK(keys_under("elastic/epoch-1") > 0);
  // b joins (epoch 2): building its group erases what a wrote for epoch 1's.
  auto b = join_membership(s, "b");
  auto gb = elastic_group::make(b, s);
  REQUIRE(gb.has_value());
  REQUIRE((*ga)->wait_for_change(1, 10s).has_value());
  std::optional<expected<elastic_group::view>> vb;
  std::thread tb([&] { vb = (*gb)->rebuild(20s); });
  auto second = (*ga)->rebuild(20s);
  tb.join();
  REQUIRE_MESSAGE(second.has_value(), second.error().to_string());
  REQUIRE_MESSAGE(vb->has_value(), vb->error().to_string());
  CHECK(second->epoch.number == 2);
  CHECK(keys_under("elastic/epoch-1") == 0);
  const auto of_epoch_2 = keys_under("elastic/epoch-2");
  CHECK(of_epoch_2 > 0);
  // b leaves (epoch 3): a's keys of epoch 2 go; b's stay, as b builds nothing later.
  (*gb)->shutdown(5s);
  REQUIRE(b->shutdown(5s));
  // a's service learns of the leave on its own schedule: wait for epoch 3 before building.
  REQUIRE((*ga)->wait_for_change(2, 10s).has_value());
  auto third = (*ga)->rebuild(20s);
  REQUIRE_MESSAGE(third.has_value(), third.error().to_string());
  CHECK(third->epoch.number == 3);
  const auto left_behind = keys_under("elastic/epoch-2");
  CHECK(left_behind >= 0);
  CHECK(left_behind < of_epoch_2);
  (*ga)->shutdown(5s);
  CHECK(a->shutdown(5s));
}
