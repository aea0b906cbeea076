// etcd_store against a real etcd: prefixes, atomicity across clients, watches, leases,
// and failures of etcd itself. The store contract shared by every backend runs in
// etcd_contract_test.cpp.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <set>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <troupe/store/connect.hpp>
#include <troupe/store/etcd_store.hpp>
#include "support/child_process.hpp"
#include "support/etcd_server.hpp"
#include "support/peer_main.hpp"
#include "support/skip.hpp"

using namespace std::chrono_literals;
using troupe::bytes;
using troupe::errc;
using troupe::etcd_store;
using troupe::etcd_store_options;
using troupe::test::etcd_server;

#define TROUPE_NEED_ETCD(var)        \
  auto* var = etcd_server::shared(); \
  if (!var) TROUPE_SKIP_TEST(etcd_server::skip_reason())

namespace {

etcd_store_options options_for(const std::string& endpoint, const std::string& prefix,
                               troupe::duration ttl = 10s) {
  etcd_store_options o;
  o.endpoints = {endpoint};
  o.prefix = prefix;
  o.lease_ttl = ttl;
  o.attach_lease = true;  // these tests exercise leased keys unless they say otherwise
  o.timeout = 10s;
  return o;
}

std::unique_ptr<etcd_store> connect(const etcd_store_options& o) {
  auto s = etcd_store::connect(o);
  REQUIRE_MESSAGE(s.has_value(), (s ? std::string() : s.error().to_string()));
  return std::move(*s);
}

troupe::duration since(troupe::clock::time_point t) {
  return std::chrono::duration_cast<troupe::duration>(troupe::clock::now() - t);
}

// Polls (in the test only) until `key` is gone from the root view, at most `limit`.
bool vanishes(etcd_store& root, const std::string& key, troupe::duration limit) {
  const auto until = troupe::deadline::after(limit);
  std::vector<std::string> keys{key};
  while (!until.expired()) {
    auto present = root.check(keys, 5s);
    REQUIRE(present.has_value());
    if (!*present) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// The peer process of "the keys of a killed process expire with its lease": holds a 2 s
// lease and its key "child" under the prefix until it is killed (at most 5 minutes). Its
// argument is "<endpoint> <prefix>".
int hold_leased_key(const std::string& arg) {
  const auto space = arg.find(' ');
  auto s = etcd_store::connect(options_for(arg.substr(0, space), arg.substr(space + 1), 2s));
  if (!s || !(*s)->set("child", "alive")) return 1;
  std::this_thread::sleep_for(std::chrono::minutes(5));
  return 2;
}

TROUPE_TEST_PEER_ROLE("etcd_leased_key_holder", hold_leased_key);

}  // namespace

TEST_CASE("an etcd_store keeps its keys under its prefix and counts only those") {
  TROUPE_NEED_ETCD(etcd);
  const auto base = troupe::test::unique_etcd_prefix("prefix");
  auto a = connect(options_for(etcd->endpoint(), base + "a"));
  auto b = connect(options_for(etcd->endpoint(), base + "b/"));
  CHECK(a->prefix() == base + "a/");
  CHECK(b->prefix() == base + "b/");
  REQUIRE(a->set("x", "1"));
  REQUIRE(a->set("y", "2"));
  REQUIRE(b->set("x", "3"));
  CHECK(*a->num_keys(5s) == 2);
  CHECK(*b->num_keys(5s) == 1);
  CHECK(*a->get_string("x") == "1");
  CHECK(*b->get_string("x") == "3");

  // A store with the parent prefix sees the full keys.
  auto root = connect(options_for(etcd->endpoint(), base));
  CHECK(*root->get_string("a/y") == "2");
  CHECK(*root->get_string("b/x") == "3");
  CHECK(*root->num_keys(5s) == 3);
  CHECK(*root->num_keys_with_prefix("a/", 5s) == 2);
  CHECK(a->describe().find(etcd->endpoint()) != std::string::npos);
  CHECK(a->describe().find(base + "a/") != std::string::npos);
}

TEST_CASE("etcd_store round-trips binary and empty values and reports erase and check") {
  TROUPE_NEED_ETCD(etcd);
  auto s = connect(options_for(etcd->endpoint(), troupe::test::unique_etcd_prefix("basic")));
  bytes binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<std::byte>(i));
  REQUIRE(s->set("bin", binary, 5s));
  CHECK(*s->get("bin", 5s) == binary);
  REQUIRE(s->set("empty", bytes{}, 5s));
  CHECK(s->get("empty", 5s)->empty());
  std::vector<std::string> both{"bin", "empty"}, with_missing{"bin", "nope"};
  CHECK(*s->check(both, 5s));
  CHECK_FALSE(*s->check(with_missing, 5s));
  CHECK(*s->erase("bin", 5s));
  CHECK_FALSE(*s->erase("bin", 5s));
  CHECK_FALSE(*s->check(both, 5s));
  auto empty_key = s->set("", "v");
  REQUIRE_FALSE(empty_key);
  CHECK(empty_key.error().code() == errc::invalid_argument);

  REQUIRE(s->set("text", "seven"));
  auto bad_add = s->add("text", 1);
  REQUIRE_FALSE(bad_add);
  CHECK(bad_add.error().code() == errc::invalid_argument);
  CHECK(bad_add.error().message().find("seven") != std::string::npos);

  REQUIRE(s->set("big", std::to_string(INT64_MAX)));
  auto overflow = s->add("big", 1);
  REQUIRE_FALSE(overflow);
  CHECK(overflow.error().code() == errc::invalid_argument);
}

TEST_CASE("concurrent adds from separate etcd clients are atomic") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("add");
  constexpr int clients = 6, adds = 15;
  std::vector<std::vector<std::int64_t>> seen(clients);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  // The counter is attached to the lease of its last writer, so every client stays
  // connected until all are done (a closing client would delete it).
  std::latch finished(clients), released(1);
  std::unique_ptr<etcd_store> observer = connect(options_for(etcd->endpoint(), prefix));
  std::string final_value;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      auto s = etcd_store::connect(options_for(etcd->endpoint(), prefix));
      for (int i = 0; s && i < adds; ++i) {
        auto v = (*s)->add("counter", 1, 30s);
        if (!v) break;
        seen[c].push_back(*v);
      }
      if (!s || seen[c].size() != adds) ++failures;
      finished.arrive_and_wait();
      if (c == 0) {
        final_value = observer->get_string("counter", 5s).value_or("missing");
        released.count_down();
      }
      released.wait();
    });
  for (auto& t : threads) t.join();
  REQUIRE(failures.load() == 0);
  CHECK(final_value == std::to_string(clients * adds));
  std::set<std::int64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  CHECK(all.size() == static_cast<std::size_t>(clients * adds));
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == clients * adds);
  REQUIRE(observer->set("counter", "7"));
  CHECK(observer->add("counter", -10).value_or(0) == -3);
}

TEST_CASE("compare_set across etcd clients elects exactly one winner") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("cas");
  constexpr int clients = 8;
  std::vector<std::string> results(clients);
  std::vector<std::thread> threads;
  // Every client keeps its store (and so its lease and key) until all have answered.
  std::latch answered(clients);
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      auto s = etcd_store::connect(options_for(etcd->endpoint(), prefix));
      if (s) {
        auto r = (*s)->compare_set("leader", std::nullopt,
                                   troupe::to_bytes("c" + std::to_string(c)), 10s);
        if (r) results[c] = troupe::to_string(*r);
      }
      answered.arrive_and_wait();
    });
  for (auto& t : threads) t.join();
  auto s = connect(options_for(etcd->endpoint(), prefix));
  REQUIRE(s->set("leader", results[0]));
  int winners = 0;
  for (int c = 0; c < clients; ++c) {
    CHECK(results[c] == results[0]);
    if (results[c] == "c" + std::to_string(c)) ++winners;
  }
  CHECK(winners == 1);

  // Swaps from a known value, and a failed swap reports the current value.
  CHECK(troupe::to_string(*s->compare_set("leader", troupe::to_bytes(results[0]),
                                          troupe::to_bytes("next"), 5s)) == "next");
  CHECK(troupe::to_string(*s->compare_set("leader", troupe::to_bytes("stale"),
                                          troupe::to_bytes("other"), 5s)) == "next");
  // An expected value for an absent key stores nothing.
  CHECK(s->compare_set("absent", troupe::to_bytes("x"), troupe::to_bytes("y"), 5s)->empty());
  CHECK_FALSE(*s->check(std::vector<std::string>{"absent"}, 5s));
}

TEST_CASE("get blocks until another etcd client sets the key, woken by the watch") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("get");
  auto reader = connect(options_for(etcd->endpoint(), prefix));
  auto writer = connect(options_for(etcd->endpoint(), prefix));
  const auto start = troupe::clock::now();
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    writer->set("late", "here").value();
  });
  auto v = reader->get_string("late", 20s);
  later.join();
  REQUIRE(v.has_value());
  CHECK(*v == "here");
  CHECK(since(start) >= 250ms);
  CHECK(since(start) < 5s);

  auto missing = reader->get("never", 400ms);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code() == errc::timeout);
  CHECK(missing.error().message().find("never") != std::string::npos);
}

TEST_CASE("wait on etcd returns when the last key appears and names the missing on timeout") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("wait");
  auto waiter = connect(options_for(etcd->endpoint(), prefix));
  auto writer = connect(options_for(etcd->endpoint(), prefix));
  std::vector<std::string> keys{"rank/0", "rank/1", "rank/2", "zzz"};
  REQUIRE(writer->set("rank/0", "a"));
  std::thread later([&] {
    for (const char* k : {"rank/2", "zzz", "rank/1"}) {
      std::this_thread::sleep_for(100ms);
      writer->set(k, "x").value();
    }
  });
  auto done = waiter->wait(keys, 20s);
  later.join();
  CHECK(done.has_value());

  std::vector<std::string> some{"rank/0", "ghost/1", "ghost/2"};
  auto timed_out = waiter->wait(some, 300ms);
  REQUIRE_FALSE(timed_out);
  CHECK(timed_out.error().code() == errc::timeout);
  CHECK(timed_out.error().message().find("ghost/1") != std::string::npos);
  CHECK(timed_out.error().message().find("'rank/0'") == std::string::npos);
}

TEST_CASE("check and wait handle more keys than one etcd transaction may hold") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("many");
  auto waiter = connect(options_for(etcd->endpoint(), prefix));
  auto writer = connect(options_for(etcd->endpoint(), prefix));
  std::vector<std::string> keys;
  for (int i = 0; i < 150; ++i) keys.push_back("k" + std::to_string(1000 + i));
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) REQUIRE(writer->set(keys[i], "x"));
  CHECK_FALSE(*waiter->check(keys, 5s));
  std::thread last([&] {
    std::this_thread::sleep_for(200ms);
    writer->set(keys.back(), "x").value();
  });
  auto done = waiter->wait(keys, 20s);
  last.join();
  CHECK(done.has_value());
  CHECK(*waiter->check(keys, 5s));
}

TEST_CASE("close revokes the lease, deleting the keys the store wrote") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("close");
  auto observer = connect(options_for(etcd->endpoint(), prefix));
  auto s = connect(options_for(etcd->endpoint(), prefix));
  REQUIRE(s->set("mine", "1"));
  CHECK(*observer->check(std::vector<std::string>{"mine"}, 5s));
  s->close();
  s->close();  // idempotent
  CHECK_FALSE(*observer->check(std::vector<std::string>{"mine"}, 5s));
  auto after = s->set("again", "1");
  REQUIRE_FALSE(after);
  CHECK(after.error().code() == errc::shut_down);
}

TEST_CASE("close makes a get blocked on etcd fail promptly with shut_down") {
  TROUPE_NEED_ETCD(etcd);
  auto s = connect(options_for(etcd->endpoint(), troupe::test::unique_etcd_prefix("abort")));
  std::atomic<bool> returned{false};
  troupe::expected<bytes> result = bytes{};
  std::thread blocked([&] {
    result = s->get("never", 30s);
    returned = true;
  });
  std::this_thread::sleep_for(300ms);
  const auto start = troupe::clock::now();
  s->close();
  blocked.join();
  CHECK(since(start) < 3s);
  REQUIRE_FALSE(result);
  CHECK(result.error().code() == errc::shut_down);
}

TEST_CASE("a participant that stops renewing its lease loses its keys after the TTL") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("lapse");
  auto observer = connect(options_for(etcd->endpoint(), prefix));
  auto mortal = connect(options_for(etcd->endpoint(), prefix, 2s));
  REQUIRE(mortal->set("heartbeat", "alive"));
  // Renewal keeps the key past several TTLs.
  std::this_thread::sleep_for(2500ms);
  REQUIRE(*observer->check(std::vector<std::string>{"heartbeat"}, 5s));

  mortal->abandon_lease_for_testing();
  const auto start = troupe::clock::now();
  mortal.reset();  // no revoke: as if the process had crashed
  CHECK(*observer->check(std::vector<std::string>{"heartbeat"}, 5s));
  CHECK(vanishes(*observer, "heartbeat", 15s));
  CHECK(since(start) >= 1s);
  auto gone = observer->get("heartbeat", 300ms);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().code() == errc::timeout);
}

TEST_CASE("the keys of a killed process expire with its lease") {
  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("killed");
  const std::string endpoint = etcd->endpoint();
  // The child holds a 2 s lease and its key until it is killed.
  auto child = troupe::test::child_process::start(
      {"/proc/self/exe"}, {.env = {"TROUPE_TEST_PEER=etcd_leased_key_holder",
                                   "TROUPE_TEST_PEER_ARG=" + endpoint + " " + prefix}});
  REQUIRE_MESSAGE(child.started(), child.start_error());
  auto observer = connect(options_for(endpoint, prefix));
  auto v = observer->get_string("child", 20s);
  REQUIRE(v.has_value());
  CHECK(*v == "alive");
  std::this_thread::sleep_for(2500ms);  // longer than the TTL: renewal works
  CHECK(*observer->check(std::vector<std::string>{"child"}, 5s));
  child.signal(SIGKILL);
  child.wait(10s);
  CHECK(vanishes(*observer, "child", 15s));
}

TEST_CASE("etcd_store calls fail with connection_lost within their deadline once etcd stops") {
  if (!etcd_server::available()) TROUPE_SKIP_TEST(etcd_server::skip_reason());
  auto server = etcd_server::start();
  REQUIRE_MESSAGE(server.has_value(), (server ? "" : server.error().to_string()));
  auto s = connect(options_for((*server)->endpoint(), "/stop/"));
  REQUIRE(s->set("k", "v"));

  // A get blocked on a watch learns of the loss promptly.
  troupe::expected<bytes> blocked_result = bytes{};
  std::thread blocked([&] { blocked_result = s->get("never", 30s); });
  std::this_thread::sleep_for(300ms);
  auto start = troupe::clock::now();
  (*server)->stop();
  blocked.join();
  CHECK(since(start) < 10s);
  REQUIRE_FALSE(blocked_result);
  CHECK(blocked_result.error().code() == errc::connection_lost);

  for (auto op : {0, 1, 2}) {
    start = troupe::clock::now();
    troupe::error e;
    if (op == 0) e = s->set("k", troupe::to_bytes("w"), 2s).error();
    if (op == 1) e = s->get("k", 2s).error();
    if (op == 2) e = s->add("n", 1, 2s).error();
    CHECK(since(start) <= 3s);
    CHECK(e.code() == errc::connection_lost);
    CHECK(e.message().find((*server)->endpoint()) != std::string::npos);
  }
  s.reset();  // the revoke fails, bounded by close_timeout
}

TEST_CASE("etcd_store endpoints: malformed ones are rejected, dead ones are skipped") {
  auto bad = etcd_store::connect({.endpoints = {"not-an-endpoint"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.error().message().find("not-an-endpoint") != std::string::npos);
  CHECK(bad.error().message().find("host:port") != std::string::npos);

  auto bad_port = etcd_store::connect({.endpoints = {"127.0.0.1:99999"}});
  REQUIRE_FALSE(bad_port);
  CHECK(bad_port.error().code() == errc::invalid_argument);

  auto none = etcd_store::connect({.endpoints = {}});
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == errc::invalid_argument);

  // Port 1 on loopback refuses connections: retried until the connect timeout, then
  // reported with the endpoint's reason.
  etcd_store_options refused;
  refused.endpoints = {"127.0.0.1:1"};
  refused.timeout = 1s;
  const auto start = troupe::clock::now();
  auto dead = etcd_store::connect(refused);
  REQUIRE_FALSE(dead);
  CHECK(since(start) >= 900ms);
  CHECK(since(start) < 4s);
  CHECK(dead.error().code() == errc::connection_lost);
  CHECK(dead.error().message().find("127.0.0.1:1") != std::string::npos);

  TROUPE_NEED_ETCD(etcd);
  auto failover = etcd_store::connect({.endpoints = {"127.0.0.1:1", "http://" + etcd->endpoint()},
                                       .prefix = troupe::test::unique_etcd_prefix("failover")});
  REQUIRE_MESSAGE(failover.has_value(), (failover ? "" : failover.error().to_string()));
  CHECK((*failover)->set("k", "v").has_value());
  CHECK(*(*failover)->get_string("k") == "v");
}

TEST_CASE("etcd store URLs name endpoints, the prefix and lease options") {
  auto one = troupe::parse_etcd_store_url("etcd://127.0.0.1:2379/job7");
  REQUIRE(one.has_value());
  CHECK(one->endpoints == std::vector<std::string>{"127.0.0.1:2379"});
  CHECK(one->prefix == "/job7");
  CHECK_FALSE(one->attach_lease);

  auto many = troupe::parse_etcd_store_url(
      "etcd://10.0.0.1:2379,10.0.0.2:2379/a/b?lease_ttl=5s&attach_lease=true");
  REQUIRE(many.has_value());
  CHECK(many->endpoints.size() == 2);
  CHECK(many->prefix == "/a/b");
  CHECK(many->lease_ttl == 5s);
  CHECK(many->attach_lease);

  auto bare = troupe::parse_etcd_store_url("etcd://h:1");
  REQUIRE(bare.has_value());
  CHECK(bare->prefix == etcd_store_options{}.prefix);

  for (const char* bad : {"etcd://", "etcd://nohost/x", "etcd://h:1/x?ttl=3", "tcp://h:1"}) {
    CAPTURE(bad);
    auto r = troupe::parse_etcd_store_url(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
  }

  TROUPE_NEED_ETCD(etcd);
  const auto prefix = troupe::test::unique_etcd_prefix("url");
  auto s = troupe::connect_store("etcd://" + etcd->endpoint() + prefix);
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.error().to_string()));
  REQUIRE((*s)->set("k", "v"));
  auto direct = connect(options_for(etcd->endpoint(), prefix));
  CHECK(*direct->get_string("k", 5s) == "v");
}

TEST_CASE("connecting while etcd is still starting succeeds once it answers, within the timeout") {
  if (!troupe::test::etcd_server::available())
    TROUPE_SKIP_TEST(troupe::test::etcd_server::skip_reason());
  auto etcd = troupe::test::etcd_server::start();
  REQUIRE_MESSAGE(etcd.has_value(), (etcd ? "" : etcd.error().to_string()));
  (*etcd)->stop();
  auto o = options_for((*etcd)->endpoint(), troupe::test::unique_etcd_prefix("late"));
  o.timeout = 20s;
  troupe::expected<std::unique_ptr<etcd_store>> s = troupe::make_error(errc::timeout, "not run");
  std::thread client([&] { s = etcd_store::connect(o); });
  // The job's etcd comes up after its first client. (Restarted from this thread: the
  // fixture's etcd dies with the thread that started it.)
  std::this_thread::sleep_for(700ms);
  auto restarted = (*etcd)->restart();
  client.join();
  REQUIRE_MESSAGE(restarted.has_value(), (restarted ? "" : restarted.error().to_string()));
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.error().to_string()));
  CHECK((*s)->set("k", "v").has_value());
  CHECK(*(*s)->get_string("k") == "v");
}
