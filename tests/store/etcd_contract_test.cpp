// Runs the store contract against etcd_store on one etcd per test executable; each
// fixture works under its own key prefix.
//
// The contract lets a handle write a key and go away while others keep using the key.
// A leased etcd_store deletes its keys when it closes, so the fixtures are:
// - etcd_fixture: independent clients with attach_lease = false;
// - etcd_leased_fixture: handles onto one leased client, which lives as long as the
//   fixture (the suite's threads then share one lease and one connection pool);
// - prefix_over_etcd_fixture: a prefix_store over independent unleased clients.
//
// Without an etcd binary the fixture prints the skip marker (CTest then reports the test
// as skipped) and open() returns nullptr, which ends the test case.
#include "store_contract.hpp"

#include <cstdio>

#include <troupe/store/etcd_store.hpp>
#include <troupe/store/prefix_store.hpp>
#include "support/etcd_server.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::duration;
using troupe::expected;
using troupe::test::etcd_server;

troupe::etcd_store_options options(etcd_server& server, const std::string& prefix, bool leased) {
  troupe::etcd_store_options o;
  o.endpoints = {server.endpoint()};
  o.prefix = prefix;
  o.timeout = 10s;
  o.attach_lease = leased;
  return o;
}

etcd_server* server_or_skip() {
  etcd_server* server = etcd_server::shared();
  if (!server) {
    std::printf("[troupe-skip] %s\n", etcd_server::skip_reason().c_str());
    std::fflush(stdout);
  }
  return server;
}

struct etcd_fixture {
  etcd_server* server = server_or_skip();
  std::string prefix = troupe::test::unique_etcd_prefix("contract");
  std::unique_ptr<troupe::store> open() {
    if (!server) return nullptr;
    return troupe::connect_etcd_store(options(*server, prefix, false)).value();
  }
};

// A handle that forwards to a store it does not own.
class borrowed_store final : public troupe::store {
 public:
  explicit borrowed_store(troupe::store& s) : s_(s) { set_timeout(s.timeout()); }
  using store::add;
  using store::get;
  using store::set;
  using store::wait;
  expected<void> set(std::string_view k, std::span<const std::byte> v, duration t) override {
    return s_.set(k, v, t);
  }
  expected<troupe::bytes> get(std::string_view k, duration t) override { return s_.get(k, t); }
  expected<bool> check(std::span<const std::string> k, duration t) override {
    return s_.check(k, t);
  }
  expected<std::int64_t> add(std::string_view k, std::int64_t d, duration t) override {
    return s_.add(k, d, t);
  }
  expected<troupe::bytes> compare_set(std::string_view k, const std::optional<troupe::bytes>& e,
                                      std::span<const std::byte> v, duration t) override {
    return s_.compare_set(k, e, v, t);
  }
  expected<bool> erase(std::string_view k, duration t) override { return s_.erase(k, t); }
  expected<void> wait(std::span<const std::string> k, duration t) override { return s_.wait(k, t); }
  expected<std::int64_t> num_keys(duration t) override { return s_.num_keys(t); }
  std::string describe() const override { return s_.describe(); }

 private:
  troupe::store& s_;
};

struct etcd_leased_fixture {
  etcd_server* server = server_or_skip();
  std::unique_ptr<troupe::etcd_store> client =
      server ? troupe::etcd_store::connect(
                   options(*server, troupe::test::unique_etcd_prefix("leased"), true))
                   .value()
             : nullptr;
  std::unique_ptr<troupe::store> open() {
    if (!client) return nullptr;
    return std::make_unique<borrowed_store>(*client);
  }
};

struct prefix_over_etcd_fixture {
  etcd_fixture etcd;
  std::unique_ptr<troupe::store> open() {
    auto base = etcd.open();
    if (!base) return nullptr;
    return std::make_unique<troupe::prefix_store>(std::shared_ptr<troupe::store>(std::move(base)),
                                                  "epoch-3");
  }
};

}  // namespace

TYPE_TO_STRING(etcd_fixture);
TYPE_TO_STRING(etcd_leased_fixture);
TYPE_TO_STRING(prefix_over_etcd_fixture);
TEST_CASE_TEMPLATE_APPLY(store_contract,
                         std::tuple<etcd_fixture, etcd_leased_fixture, prefix_over_etcd_fixture>);
