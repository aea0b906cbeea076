// prefix_store namespacing and counting; connect_store URLs; the key ledger.
#include <doctest/doctest.h>

#include <cstdlib>

#include <troupe/store/connect.hpp>
#include <troupe/store/key_ledger.hpp>
#include <troupe/store/memory_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include <troupe/store/tcp_store_server.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::errc;

// A store without the prefix-counting capability (forwards to a memory_store).
class plain_store final : public troupe::store {
 public:
  using troupe::store::add;
  using troupe::store::get;
  using troupe::store::set;
  using troupe::store::wait;
  troupe::expected<void> set(std::string_view k, std::span<const std::byte> v,
                             troupe::duration t) override {
    return m_.set(k, v, t);
  }
  troupe::expected<troupe::bytes> get(std::string_view k, troupe::duration t) override {
    return m_.get(k, t);
  }
  troupe::expected<bool> check(std::span<const std::string> k, troupe::duration t) override {
    return m_.check(k, t);
  }
  troupe::expected<std::int64_t> add(std::string_view k, std::int64_t d,
                                     troupe::duration t) override {
    return m_.add(k, d, t);
  }
  troupe::expected<troupe::bytes> compare_set(std::string_view k,
                                              const std::optional<troupe::bytes>& e,
                                              std::span<const std::byte> d,
                                              troupe::duration t) override {
    return m_.compare_set(k, e, d, t);
  }
  troupe::expected<bool> erase(std::string_view k, troupe::duration t) override {
    return m_.erase(k, t);
  }
  troupe::expected<void> wait(std::span<const std::string> k, troupe::duration t) override {
    return m_.wait(k, t);
  }
  troupe::expected<std::int64_t> num_keys(troupe::duration t) override { return m_.num_keys(t); }
  std::string describe() const override { return "plain_store"; }

 private:
  troupe::memory_store m_;
};

}  // namespace

TEST_CASE("prefix_store puts keys under its prefix") {
  troupe::memory_store base;
  troupe::prefix_store p(base, "round-3");
  REQUIRE(p.set("addr", std::string_view("h:1")));
  CHECK(troupe::to_string(base.get("round-3/addr", 1s).value()) == "h:1");
  CHECK(p.full_key("x") == "round-3/x");
  CHECK(p.describe().find("round-3") != std::string::npos);
}

TEST_CASE("prefix_store num_keys counts only the keys of its own prefix") {
  troupe::memory_store base;
  REQUIRE(base.set("outside", std::string_view("1")));
  REQUIRE(base.set("round-10/x", std::string_view("1")));  // shares the text "round-1"
  troupe::prefix_store a(base, "round-1");
  troupe::prefix_store b(base, "round-2");
  troupe::prefix_store nested(a, "inner");
  REQUIRE(a.set("k1", std::string_view("1")));
  REQUIRE(a.set("k2", std::string_view("1")));
  REQUIRE(b.set("k1", std::string_view("1")));
  REQUIRE(nested.set("k", std::string_view("1")));
  CHECK(a.num_keys(1s).value() == 3);  // k1, k2 and inner/k
  CHECK(b.num_keys(1s).value() == 1);
  CHECK(nested.num_keys(1s).value() == 1);
  CHECK(base.num_keys(1s).value() == 6);
}

TEST_CASE("prefix_store over a store that cannot count by prefix reports unsupported") {
  plain_store base;
  troupe::prefix_store p(base, "ns");
  REQUIRE(p.set("k", std::string_view("v")));
  auto n = p.num_keys(1s);
  REQUIRE_FALSE(n.has_value());
  CHECK(n.error().code() == errc::unsupported);
  CHECK(n.error().message().find("plain_store") != std::string::npos);
}

TEST_CASE("connect_store opens memory urls and shares named ones within the process") {
  auto fresh = troupe::connect_store("memory://");
  REQUIRE(fresh.has_value());
  auto a = troupe::connect_store("memory://shared-test");
  auto b = troupe::connect_store("memory://shared-test");
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE((*a)->set("k", std::string_view("v")));
  CHECK(troupe::to_string((*b)->get("k", 1s).value()) == "v");
  std::array<std::string, 1> keys{"k"};
  CHECK_FALSE((*fresh)->check(keys, 1s).value());
}

TEST_CASE("connect_store opens a tcp url") {
  auto server = troupe::tcp_store_server::start({}).value();
  troupe::store_options o;
  o.connect_timeout = 5s;
  auto s = troupe::connect_store(server->url(), o);
  REQUIRE(s.has_value());
  REQUIRE((*s)->set("k", std::string_view("v")));
  CHECK((*s)->describe().find(std::to_string(server->port())) != std::string::npos);
}

TEST_CASE(
    "connect_store sends TROUPE_JOB_SECRET, else TROUPE_STORE_SECRET, and a wrong one is refused") {
  troupe::tcp_store_server_options so;
  so.secret = "job-secret";
  auto server = troupe::tcp_store_server::start(so).value();
  troupe::store_options o;
  o.connect_timeout = 5s;
  auto attempt = [&] { return troupe::connect_store(server->url(), o); };
  ::unsetenv("TROUPE_JOB_SECRET");
  ::unsetenv("TROUPE_STORE_SECRET");
  auto none = attempt();
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == troupe::errc::unauthorized);
  ::setenv("TROUPE_STORE_SECRET", "job-secret", 1);  // the older name
  CHECK(attempt().has_value());
  ::setenv("TROUPE_JOB_SECRET", "another-job", 1);  // the new name wins
  auto wrong = attempt();
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code() == troupe::errc::unauthorized);
  ::setenv("TROUPE_JOB_SECRET", "job-secret", 1);
  CHECK(attempt().has_value());
  ::unsetenv("TROUPE_JOB_SECRET");
  ::unsetenv("TROUPE_STORE_SECRET");
}

TEST_CASE("connect_store refuses an unknown scheme and names the supported ones") {
  auto s = troupe::connect_store("redis://localhost:6379");
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code() == errc::invalid_argument);
  const auto& m = s.error().message();
  CHECK(m.find("unknown store URL scheme 'redis'") != std::string::npos);
  CHECK(m.find("tcp://") != std::string::npos);
  CHECK(m.find("etcd://") != std::string::npos);
  CHECK(m.find("memory://") != std::string::npos);
}

TEST_CASE("connect_store refuses tcp urls without a usable host and port") {
  for (const char* url :
       {"tcp://localhost", "tcp://:29500", "tcp://h:99999", "tcp://h:0", "localhost:29500"}) {
    CAPTURE(url);
    auto s = troupe::connect_store(url);
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code() == errc::invalid_argument);
  }
  auto v6 = troupe::parse_host_port("[::1]:29500");
  REQUIRE(v6.has_value());
  CHECK(v6->first == "::1");
  CHECK(v6->second == 29500);
}

TEST_CASE("a key ledger erases the keys written through it, and only those") {
  using troupe::key_ledger;
  using troupe::memory_store;
  auto base = std::make_shared<memory_store>();
  REQUIRE(base->set("theirs", std::string_view("x")));
  key_ledger ledger(base);
  REQUIRE(ledger.set("a", std::string_view("1")));
  REQUIRE(ledger.add("b", 2));
  REQUIRE(ledger.compare_set("c", std::nullopt, troupe::to_bytes(std::string("3")), 1s));
  REQUIRE(ledger.get("theirs", 1s));  // reads are not recorded
  CHECK(ledger.written() == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(ledger.erase("a", 1s));
  CHECK(ledger.written() == std::vector<std::string>{"b", "c"});
  auto erased = ledger.erase_written(1s);
  REQUIRE(erased);
  CHECK(*erased == 2);
  CHECK(ledger.written().empty());
  CHECK(*base->num_keys(1s) == 1);  // "theirs" stays
  CHECK(base->get("theirs", 1s).has_value());
}
