// The epoch record and the pure rules of the next epoch (docs/membership.md).
#include <doctest/doctest.h>

#include <troupe/membership/epoch.hpp>

using namespace troupe::membership;
using troupe::errc;

namespace {

member make(std::string name, std::int64_t pid) {
  member m;
  m.name = std::move(name);
  m.host = "h" + std::to_string(pid % 3);
  m.pid = pid;
  m.incarnation = "inc" + std::to_string(pid);
  return m;
}

epoch of(std::uint64_t number, std::vector<member> ms) {
  epoch e;
  e.number = number;
  for (std::size_t i = 0; i < ms.size(); ++i) ms[i].rank = static_cast<int>(i);
  e.members = std::move(ms);
  e.cause = "test";
  return e;
}

}  // namespace

TEST_CASE("an epoch record reads back to the same epoch") {
  auto e = of(7, {make("worker0", 10), make("worker1", 11), make("worker5", 15)});
  e.cause = "dead: worker3 (rank 3, host h0, pid 13): heartbeat silent for 10s";
  auto back = decode(encode(e));
  REQUIRE(back.has_value());
  CHECK(*back == e);
  CHECK(back->members[2].rank == 2);
}

TEST_CASE("a record that is not an epoch record is refused naming the bad line") {
  auto r = decode("troupe-epoch 1\nnumber 3\nmember onlyname\n");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::protocol_error);
  CHECK(r.error().message().find("member onlyname") != std::string::npos);
  CHECK_FALSE(decode("something else\n").has_value());
  CHECK_FALSE(decode("").has_value());
}

TEST_CASE("the next epoch keeps survivors in rank order and appends joiners sorted by name") {
  auto e = of(4, {make("c", 1), make("a", 2), make("d", 3), make("b", 4)});
  epoch_change change;
  change.remove.push_back({"a", {}});
  change.remove.push_back({"b", "inc4"});
  change.add = {make("z", 9), make("y", 8)};
  change.cause = "resize";
  auto next = next_epoch(e, change);
  REQUIRE(next.has_value());
  CHECK(next->number == 5);
  CHECK(next->names() == "c,d,y,z");
  for (std::size_t i = 0; i < next->size(); ++i)
    CHECK(next->members[i].rank == static_cast<int>(i));
  CHECK(next->cause == "resize");
  // The same change on the same epoch gives the same epoch: ranks are not chosen locally.
  CHECK(*next_epoch(e, change) == *next);
}

TEST_CASE("a change that changes nothing leaves the epoch number as it is") {
  auto e = of(3, {make("a", 1), make("b", 2)});
  epoch_change change;
  change.remove.push_back({"gone", {}});
  change.remove.push_back({"a", "another-incarnation"});
  change.add.push_back(e.members[1]);
  auto next = next_epoch(e, change);
  REQUIRE(next.has_value());
  CHECK(*next == e);
}

TEST_CASE(
    "a death reported by a member applies while the epoch holds it, and not to an epoch "
    "that took the reporter out") {
  auto e = of(5, {make("a", 1), make("b", 2), make("c", 3)});
  epoch_change change;
  change.remove.push_back({"c", "inc3"});
  change.cause = "dead: c";
  change.proposer = member_ref{"a", "inc1"};
  auto next = next_epoch(e, change);
  REQUIRE(next.has_value());
  CHECK(next->number == 6);
  CHECK(next->names() == "a,b");
  // "a" was itself taken out (stopped, say) and then reports "b" silent: nothing changes.
  auto without_a = of(6, {make("b", 2), make("c", 3)});
  change.remove = {{"b", "inc2"}};
  auto stale = next_epoch(without_a, change);
  REQUIRE(stale.has_value());
  CHECK(*stale == without_a);
  // Nor from a member of that name in another incarnation.
  change.proposer = member_ref{"b", "another-incarnation"};
  CHECK(*next_epoch(without_a, change) == without_a);
  // Without a proposer (a leave, a launcher's report) the change applies.
  change.proposer.reset();
  CHECK(next_epoch(without_a, change)->names() == "c");
}

TEST_CASE("a joiner whose name is held by another incarnation is refused naming the holder") {
  auto e = of(2, {make("a", 1), make("b", 2)});
  epoch_change change;
  auto clash = make("b", 99);
  change.add.push_back(clash);
  auto next = next_epoch(e, change);
  REQUIRE_FALSE(next.has_value());
  CHECK(next.error().code() == errc::already_exists);
  CHECK(next.error().message().find("b (rank 1, host h2, pid 2)") != std::string::npos);
  // Removing the old holder in the same change lets the replacement in.
  change.remove.push_back({"b", "inc2"});
  auto replaced = next_epoch(e, change);
  REQUIRE(replaced.has_value());
  CHECK(replaced->find("b")->pid == 99);
}

TEST_CASE("the membership_changed error names the new epoch and who left and who came") {
  auto before = of(5, {make("a", 1), make("b", 2), make("c", 3)});
  auto after = of(6, {make("a", 1), make("c", 3), make("d", 4)});
  after.cause = "dead: b (rank 1, host h2, pid 2): heartbeat silent for 10s";
  auto err = membership_changed_error(before, after);
  CHECK(err.code() == errc::membership_changed);
  const auto& text = err.message();
  CAPTURE(text);
  CHECK(text.find("epoch 6") != std::string::npos);
  CHECK(text.find("left: b (rank 1, host h2, pid 2)") != std::string::npos);
  CHECK(text.find("came: d (rank 2, host h1, pid 4)") != std::string::npos);
  CHECK(text.find("heartbeat silent") != std::string::npos);
  CHECK(err.to_string().rfind("membership_changed", 0) == 0);
}
