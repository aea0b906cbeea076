// The store contract, written once and run against every store implementation.
//
// A fixture type F is default-constructible, owns one fresh store, and has
//   std::unique_ptr<troupe::store> open();
// which returns a new handle onto that same store (callable several times, from any
// thread). Apply the suite to fixtures with
//   TYPE_TO_STRING(my_fixture);
//   TEST_CASE_TEMPLATE_APPLY(store_contract, std::tuple<my_fixture>);
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/store/store.hpp>

namespace troupe::contract {

inline bytes b(std::string_view s) { return to_bytes(s); }
inline std::string text(const bytes& v) { return to_string(v); }

// The keys a test names, made unique per run so that persistent backends stay clean.
inline std::string unique_key(std::string_view base) {
  static std::atomic<int> counter{0};
  return std::string(base) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace troupe::contract

TEST_CASE_TEMPLATE_DEFINE("a store keeps the store contract", F, store_contract) {
  using namespace std::chrono_literals;
  using troupe::errc;
  using troupe::contract::b;
  using troupe::contract::text;
  using troupe::contract::unique_key;
  const troupe::duration t = 5s;
  const troupe::duration brief = 200ms;

  F fixture;
  std::unique_ptr<troupe::store> s = fixture.open();
  REQUIRE(s != nullptr);
  CAPTURE(s->describe());

  SUBCASE("set then get returns the value and a second set replaces it") {
    auto k = unique_key("k");
    REQUIRE(s->set(k, b("one"), t));
    CHECK(text(s->get(k, t).value()) == "one");
    REQUIRE(s->set(k, b("two"), t));
    CHECK(text(s->get(k, t).value()) == "two");
  }

  SUBCASE("values are binary and may be empty") {
    auto k = unique_key("bin");
    troupe::bytes v{std::byte{0}, std::byte{0xff}, std::byte{0}, std::byte{7}};
    REQUIRE(s->set(k, v, t));
    CHECK(s->get(k, t).value() == v);
    auto e = unique_key("empty");
    REQUIRE(s->set(e, troupe::bytes{}, t));
    CHECK(s->get(e, t).value().empty());
  }

  SUBCASE("get waits for a key that another thread sets later") {
    auto k = unique_key("later");
    auto writer_handle = fixture.open();
    std::optional<troupe::expected<troupe::bytes>> got;
    std::thread reader([&] { got.emplace(s->get(k, t)); });
    std::array<std::string, 1> keys{k};
    // Round trips before the write, so the reader is usually already blocked.
    CHECK_FALSE(writer_handle->check(keys, t).value());
    REQUIRE(writer_handle->set(k, b("arrived"), t));
    reader.join();
    REQUIRE(got.has_value());
    REQUIRE(got->has_value());
    CHECK(text(got->value()) == "arrived");
  }

  SUBCASE("get of a missing key times out and names the key") {
    auto k = unique_key("never-set");
    auto start = std::chrono::steady_clock::now();
    auto r = s->get(k, brief);
    auto took = std::chrono::steady_clock::now() - start;
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::timeout);
    CHECK(r.error().message().find(k) != std::string::npos);
    CHECK(took >= brief - 10ms);
    CHECK(took < 3s);
  }

  SUBCASE("check tells whether every key exists without waiting") {
    auto a = unique_key("a");
    auto c = unique_key("c");
    std::vector<std::string> both{a, c};
    CHECK_FALSE(s->check(both, t).value());
    REQUIRE(s->set(a, b("1"), t));
    CHECK_FALSE(s->check(both, t).value());
    REQUIRE(s->set(c, b("1"), t));
    CHECK(s->check(both, t).value());
  }

  SUBCASE("add starts from zero and returns each new total") {
    auto k = unique_key("counter");
    CHECK(s->add(k, 5, t).value() == 5);
    CHECK(s->add(k, -7, t).value() == -2);
    CHECK(s->add(k, 0, t).value() == -2);
    CHECK(text(s->get(k, t).value()) == "-2");
    auto n = unique_key("number");
    REQUIRE(s->set(n, b("40"), t));
    CHECK(s->add(n, 2, t).value() == 42);
  }

  SUBCASE("add on a value that is not an integer is invalid_argument naming the key") {
    auto k = unique_key("word");
    REQUIRE(s->set(k, b("hello"), t));
    auto r = s->add(k, 1, t);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(r.error().message().find(k) != std::string::npos);
    CHECK(text(s->get(k, t).value()) == "hello");
  }

  SUBCASE("compare_set wins on a match and loses otherwise") {
    auto k = unique_key("cas");
    REQUIRE(s->set(k, b("a"), t));
    CHECK(text(s->compare_set(k, b("a"), b("b"), t).value()) == "b");
    CHECK(text(s->get(k, t).value()) == "b");
    CHECK(text(s->compare_set(k, b("a"), b("c"), t).value()) == "b");
    CHECK(text(s->compare_set(k, std::nullopt, b("c"), t).value()) == "b");
    CHECK(text(s->get(k, t).value()) == "b");
  }

  SUBCASE("compare_set on an absent key creates it only when absence is expected") {
    auto k = unique_key("cas-absent");
    std::array<std::string, 1> keys{k};
    CHECK(s->compare_set(k, b("x"), b("y"), t).value().empty());
    CHECK_FALSE(s->check(keys, t).value());
    CHECK(text(s->compare_set(k, std::nullopt, b("first"), t).value()) == "first");
    CHECK(text(s->get(k, t).value()) == "first");
  }

  SUBCASE("erase removes a key and says whether it existed") {
    auto k = unique_key("gone");
    REQUIRE(s->set(k, b("v"), t));
    CHECK(s->erase(k, t).value());
    CHECK_FALSE(s->erase(k, t).value());
    auto r = s->get(k, brief);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::timeout);
  }

  SUBCASE("wait returns once another thread has set every key") {
    std::vector<std::string> keys{unique_key("w1"), unique_key("w2"), unique_key("w3")};
    auto writer_handle = fixture.open();
    REQUIRE(s->set(keys[1], b("early"), t));
    troupe::expected<void> waited = troupe::make_error(errc::internal, "not run");
    std::thread waiter([&] { waited = s->wait(keys, t); });
    REQUIRE(writer_handle->set(keys[0], b("x"), t));
    REQUIRE(writer_handle->set(keys[2], b("y"), t));
    waiter.join();
    CHECK(waited.has_value());
  }

  SUBCASE("wait times out naming only the keys still missing") {
    auto present = unique_key("present");
    auto absent = unique_key("absent");
    REQUIRE(s->set(present, b("1"), t));
    std::vector<std::string> keys{present, absent};
    auto r = s->wait(keys, brief);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::timeout);
    CHECK(r.error().message().find(absent) != std::string::npos);
    CHECK(r.error().message().find(present) == std::string::npos);
  }

  SUBCASE("num_keys counts the keys that were added") {
    auto before = s->num_keys(t).value();
    REQUIRE(s->set(unique_key("n1"), b("1"), t));
    REQUIRE(s->set(unique_key("n2"), b("2"), t));
    auto k3 = unique_key("n3");
    REQUIRE(s->add(k3, 1, t));
    CHECK(s->num_keys(t).value() == before + 3);
    REQUIRE(s->erase(k3, t));
    CHECK(s->num_keys(t).value() == before + 2);
  }

  SUBCASE("concurrent adds from many threads sum exactly") {
    auto k = unique_key("sum");
    constexpr int threads = 8;
    constexpr int per_thread = 100;
    std::vector<std::thread> pool;
    std::atomic<int> failures{0};
    std::mutex first_mutex;
    std::string first;  // the first failure's error
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&, i] {
        // Half share the test's handle, half open their own.
        std::unique_ptr<troupe::store> own = i % 2 ? fixture.open() : nullptr;
        troupe::store& use = own ? *own : *s;
        // The contract is the exact sum: each add may take long behind the others (an
        // etcd store retries a lost transaction), beyond the test's usual timeout when the
        // sanitizers run beside other suites on two CPUs.
        for (int j = 0; j < per_thread; ++j)
          if (auto r = use.add(k, 1, 6 * t); !r) {
            std::lock_guard lock(first_mutex);
            if (failures.fetch_add(1) == 0) first = r.error().to_string();
          }
      });
    }
    for (auto& th : pool) th.join();
    CAPTURE(first);
    CHECK(failures.load() == 0);
    CHECK(s->add(k, 0, t).value() == threads * per_thread);
  }

  SUBCASE("an empty key is refused with invalid_argument") {
    auto r = s->set("", b("v"), t);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(s->get("", brief).error().code() == errc::invalid_argument);
  }
}
