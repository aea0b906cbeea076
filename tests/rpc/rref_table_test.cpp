// The table of remote references a worker owns, on its own: the orders in which shares,
// values and fetches can arrive, since they travel on different connections.
#include <doctest/doctest.h>

#include <troupe/rpc/detail/rref_table.hpp>

using namespace std::chrono_literals;
using namespace troupe;
using troupe::rpc::detail::rref_table;

namespace {

expected<rpc::wire::frame> value_of(std::uint8_t b) {
  rpc::wire::frame f;
  f.message.push_back(std::byte{b});
  return f;
}

rref_table::waiter fetch_request(std::uint64_t req) { return {nullptr, req, 0}; }

}  // namespace

TEST_CASE("a value lives while it has shares and goes with the last release") {
  rref_table t;
  t.created(7, "caller");
  t.add_share(7, 1, "other");
  CHECK(t.set_value(7, value_of(1)).empty());
  CHECK(t.size() == 1);
  t.release(7, 0);
  CHECK(t.size() == 1);
  t.release(7, 1);
  CHECK(t.size() == 0);
}

TEST_CASE("a fetch before the value waits and gets it when the value is stored") {
  rref_table t;
  t.created(3, "caller");
  CHECK_FALSE(t.fetch(3, fetch_request(40)).has_value());
  auto waiting = t.set_value(3, value_of(9));
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].req == 40);
  auto now = t.fetch(3, fetch_request(41));
  REQUIRE(now.has_value());
  REQUIRE(now->has_value());
  CHECK((*now)->message.at(0) == std::byte{9});
}

TEST_CASE("a release that overtakes its fork's add cancels that add") {
  rref_table t;
  t.created(5, "caller");
  t.release(5, 2);  // fork 2's add has not arrived yet
  t.add_share(5, 2, "late");
  t.release(5, 0);
  CHECK(t.size() == 0);  // fork 2 never counted, so the creator's release freed it
}

TEST_CASE("a fetch that overtakes the creating request parks, and expires without a share") {
  rref_table t;
  CHECK_FALSE(t.fetch(9, fetch_request(1)).has_value());
  CHECK(t.size() == 1);
  const auto now = clock::now();
  CHECK(t.expire_parked(now, 1h).empty());
  auto expired = t.expire_parked(now + 2h, 1h);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].first == 9);
  REQUIRE(expired[0].second.size() == 1);
  CHECK(expired[0].second[0].req == 1);
  CHECK(t.size() == 0);
}

TEST_CASE("a parked fetch is kept once the creating request arrives, and answered with the value") {
  rref_table t;
  CHECK_FALSE(t.fetch(4, fetch_request(2)).has_value());
  t.created(4, "caller");
  CHECK(t.expire_parked(clock::now() + 2h, 1h).empty());
  auto waiting = t.set_value(4, value_of(3));
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].req == 2);
}

TEST_CASE("a worker that is gone loses its shares, and values it alone held are freed") {
  rref_table t;
  t.created(1, "gone");
  t.created(2, "gone");
  t.add_share(2, 1, "stays");
  auto [dropped, freed] = t.drop_shares_of("gone");
  CHECK(dropped == 2);
  CHECK(freed == 1);
  CHECK(t.size() == 1);
}

TEST_CASE("a value stored after every holder released it is dropped, with no one to answer") {
  rref_table t;
  t.created(6, "caller");
  t.release(6, 0);
  CHECK(t.set_value(6, value_of(1)).empty());
  CHECK(t.size() == 0);
}
