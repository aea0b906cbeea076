// The host-side plan for a communicator across epochs (collectives/comm_plan.hpp): keep,
// shrink or re-create, decided from the two epochs that membership::next_epoch makes.
#include <doctest/doctest.h>

#include <troupe/collectives/comm_plan.hpp>

using namespace troupe;
using namespace troupe::collectives;
using membership::epoch;
using membership::epoch_change;

namespace {

membership::member make(std::string name, std::int64_t pid) {
  membership::member m;
  m.name = std::move(name);
  m.host = "h" + std::to_string(pid % 2);
  m.pid = pid;
  m.incarnation = "inc" + std::to_string(pid);
  return m;
}

// Epoch 1 of worker0..worker<n-1>, through next_epoch from the empty job.
epoch start(int n) {
  epoch_change c;
  for (int i = 0; i < n; ++i) c.add.push_back(make("worker" + std::to_string(i), 100 + i));
  c.cause = "start";
  auto e = membership::next_epoch(epoch{}, c);
  REQUIRE(e.has_value());
  return *e;
}

epoch without(const epoch& e, std::vector<std::string> names) {
  epoch_change c;
  for (auto& n : names) c.remove.push_back({n, {}});
  c.cause = "left";
  auto next = membership::next_epoch(e, c);
  REQUIRE(next.has_value());
  return *next;
}

epoch with(const epoch& e, std::vector<membership::member> joiners) {
  epoch_change c;
  c.add = std::move(joiners);
  c.cause = "joined";
  auto next = membership::next_epoch(e, c);
  REQUIRE(next.has_value());
  return *next;
}

comm_state healthy() {
  comm_state s;
  s.library_version = 22809;
  return s;
}

}  // namespace

TEST_CASE("departures only shrink the communicator, excluding exactly the old ranks that left") {
  auto e1 = start(4);
  auto e2 = without(e1, {"worker1", "worker3"});
  auto p = plan_comm_change(e1, e2, healthy(), "elastic/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::shrink);
  CHECK(p->excluded == std::vector<int>{1, 3});
  CHECK(p->from_epoch == 1);
  CHECK(p->to_epoch == 2);
  CHECK_FALSE(p->abort_first);
  CHECK(p->unique_id_key.empty());
  CHECK(p->left.size() == 2);
  CHECK(p->came.empty());
  CHECK(describe(*p).find("shrink") != std::string::npos);
  CHECK(describe(*p).find("worker3 (rank 3") != std::string::npos);
}

TEST_CASE("the shrunk ranks are the ranks membership gives the survivors in the new epoch") {
  auto e1 = start(5);
  auto e2 = without(e1, {"worker0", "worker2"});
  auto p = plan_comm_change(e1, e2, healthy(), "g/epoch-2");
  REQUIRE(p.has_value());
  REQUIRE(p->action == comm_action::shrink);
  REQUIRE(p->new_rank.size() == e1.size());
  CHECK(p->new_rank == std::vector<int>{-1, 0, -1, 1, 2});
  for (const auto& m : e1.members) {
    const auto* now = e2.find(m.name);
    CHECK(p->new_rank[static_cast<std::size_t>(m.rank)] == (now ? now->rank : -1));
  }
}

TEST_CASE("any arrival re-creates the communicator from a unique id under the new epoch's key") {
  auto e1 = start(2);
  auto e2 = with(e1, {make("worker9", 109)});
  auto p = plan_comm_change(e1, e2, healthy(), "elastic/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::recreate);
  CHECK(p->unique_id_key == "elastic/epoch-2/nccl/unique_id");
  CHECK(p->came.size() == 1);
  CHECK(p->came[0].find("worker9") != std::string::npos);

  SUBCASE("also when others leave in the same change") {
    epoch_change c;
    c.remove.push_back({"worker0", {}});
    c.add.push_back(make("worker7", 107));
    auto e3 = membership::next_epoch(e2, c);
    REQUIRE(e3.has_value());
    auto q = plan_comm_change(e2, *e3, healthy(), "elastic/epoch-3");
    REQUIRE(q.has_value());
    CHECK(q->action == comm_action::recreate);
    CHECK(q->excluded == std::vector<int>{0});
    CHECK(q->unique_id_key == "elastic/epoch-3/nccl/unique_id");
  }
}

TEST_CASE("a replacement with the same name but a new incarnation is a departure and an arrival") {
  auto e1 = start(2);
  epoch_change c;
  c.remove.push_back({"worker1", "inc101"});
  c.add.push_back(make("worker1", 555));
  auto e2 = membership::next_epoch(e1, c);
  REQUIRE(e2.has_value());
  auto p = plan_comm_change(e1, *e2, healthy(), "e/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::recreate);
  CHECK(p->excluded == std::vector<int>{1});
  CHECK(p->left.size() == 1);
  CHECK(p->came.size() == 1);
}

TEST_CASE("the same members keep a healthy idle communicator and re-create it after a fault") {
  auto e1 = start(3);
  auto e2 = e1;
  e2.number = 2;
  auto kept = plan_comm_change(e1, e2, healthy(), "e/epoch-2");
  REQUIRE(kept.has_value());
  CHECK(kept->action == comm_action::keep);
  CHECK(kept->excluded.empty());
  CHECK_FALSE(kept->abort_first);

  auto busy = healthy();
  busy.pending_work = true;
  auto p = plan_comm_change(e1, e2, busy, "e/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::recreate);
  CHECK(p->excluded.empty());
  CHECK(p->abort_first);
  CHECK(p->unique_id_key == "e/epoch-2/nccl/unique_id");
}

TEST_CASE("pending work or a communicator error makes the old operations abort first") {
  auto e1 = start(3);
  auto e2 = without(e1, {"worker2"});
  for (int k = 0; k < 4; ++k) {
    auto s = healthy();
    s.pending_work = (k & 1) != 0;
    s.in_error = (k & 2) != 0;
    CAPTURE(k);
    auto p = plan_comm_change(e1, e2, s, "e/epoch-2");
    REQUIRE(p.has_value());
    CHECK(p->action == comm_action::shrink);
    CHECK(p->abort_first == (k != 0));
    CHECK((p->reason.find("aborting") != std::string::npos) == (k != 0));
  }
  auto s = healthy();
  s.in_error = true;
  auto q = plan_comm_change(e1, with(e1, {make("worker8", 108)}), s, "e/epoch-2");
  REQUIRE(q.has_value());
  CHECK(q->action == comm_action::recreate);
  CHECK(q->abort_first);
}

TEST_CASE(
    "an NCCL library older than 2.27 or an aborted communicator re-creates instead of shrinking") {
  auto e1 = start(3);
  auto e2 = without(e1, {"worker0"});
  auto old_lib = healthy();
  old_lib.library_version = 22605;
  auto p = plan_comm_change(e1, e2, old_lib, "e/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::recreate);
  CHECK(p->reason.find("2.27") != std::string::npos);
  CHECK(p->reason.find("2.26.5") != std::string::npos);
  CHECK(p->unique_id_key == "e/epoch-2/nccl/unique_id");

  auto gone = healthy();
  gone.live = false;
  auto q = plan_comm_change(e1, e2, gone, "e/epoch-2");
  REQUIRE(q.has_value());
  CHECK(q->action == comm_action::recreate);
  CHECK(q->reason.find("aborted") != std::string::npos);

  CHECK(shrink_supported(22700));
  CHECK(shrink_supported(22809));
  CHECK_FALSE(shrink_supported(22699));
  CHECK_FALSE(shrink_supported(2804));
  CHECK_FALSE(shrink_supported(0));
  CHECK(format_nccl_version(22809) == "2.28.9");
  CHECK(format_nccl_version(2804) == "2.8.4");
}

TEST_CASE("survivors out of their old order cannot shrink and re-create") {
  auto e1 = start(3);
  epoch e2;
  e2.number = 2;
  e2.members = {e1.members[2], e1.members[0]};
  for (std::size_t i = 0; i < e2.members.size(); ++i) e2.members[i].rank = static_cast<int>(i);
  auto p = plan_comm_change(e1, e2, healthy(), "e/epoch-2");
  REQUIRE(p.has_value());
  CHECK(p->action == comm_action::recreate);
  CHECK(p->excluded == std::vector<int>{1});
}

TEST_CASE("a plan between epochs that are not newer, or whose ranks are not dense, is refused") {
  auto e1 = start(2);
  auto same = plan_comm_change(e1, e1, healthy(), "e/epoch-1");
  REQUIRE_FALSE(same.has_value());
  CHECK(same.error().code() == errc::invalid_argument);
  CHECK(same.error().message().find("newer") != std::string::npos);
  auto bad = e1;
  bad.number = 2;
  bad.members[1].rank = 5;
  auto r = plan_comm_change(e1, bad, healthy(), "e/epoch-2");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::invalid_argument);
}
