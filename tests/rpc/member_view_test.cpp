// An RPC worker's view of its group on its own: members in and out, lookups, the device
// setup kept in step, and which peers share this worker's host.
#include <doctest/doctest.h>

#include <troupe/rpc/detail/member_view.hpp>

using namespace troupe;
using troupe::rpc::worker_ref;
using troupe::rpc::detail::member;
using troupe::rpc::detail::member_view;

namespace {

member worker(const std::string& name, int id, const std::string& host_key, int gpus = 2) {
  member m;
  m.info = worker_info{name, id};
  m.host = "10.0.0.1";
  m.port = static_cast<std::uint16_t>(29500 + id);
  m.devices = worker_device_info{name, gpus, {}, {}};
  m.host_key = host_key;
  m.tag = "t";
  return m;
}

std::map<std::string, member> group(std::vector<member> ms) {
  std::map<std::string, member> all;
  for (auto& m : ms) all.emplace(m.info.name, std::move(m));
  return all;
}

}  // namespace

TEST_CASE("a member view finds workers by name and id, ordered by id, and names them all") {
  member_view v("a", group_kind::dynamic_group);
  REQUIRE(v.replace(group({worker("c", 2, "h"), worker("a", 0, "h"), worker("b", 1, "h")})));
  auto infos = v.infos();
  REQUIRE(infos.size() == 3);
  CHECK(infos[0].name == "a");
  CHECK(infos[2].name == "c");
  CHECK(v.find(worker_ref("b"))->id == 1);
  CHECK(v.find(worker_ref::by_id(2))->name == "c");
  auto missing = v.find(worker_ref("z"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == errc::not_found);
  CHECK(missing.error().message().find("workers: a, b, c") != std::string::npos);
  CHECK(missing.error().message().find("may have left or died") != std::string::npos);
  CHECK(v.others().size() == 2);
  CHECK(v.get("b")->port == 29501);
  CHECK_FALSE(v.get("z").has_value());
}

TEST_CASE("a member view takes out others by name and tag, never itself") {
  member_view v("a", group_kind::dynamic_group);
  REQUIRE(v.replace(group({worker("a", 0, "h"), worker("b", 1, "h")})));
  CHECK_FALSE(v.remove("a").has_value());
  CHECK_FALSE(v.remove("b", "another tag").has_value());
  auto gone = v.remove("b", "t");
  REQUIRE(gone.has_value());
  CHECK(gone->info.name == "b");
  CHECK_FALSE(v.remove("b").has_value());
  CHECK(v.infos().size() == 1);
}

TEST_CASE("a member view keeps the device setup in step and refuses one it cannot resolve") {
  member_view v("a", group_kind::static_group);
  // b sends its cuda:0 to a's cuda:1; results from a go back through the reverse.
  auto b = worker("b", 1, "h");
  (void)b.devices.maps["a"].set(*device::cuda(0), *device::cuda(1));
  REQUIRE(v.replace(group({worker("a", 0, "h"), b})));
  auto back = v.reverse_map_for("b");
  REQUIRE(back.has_value());
  CHECK(back->find(*device::cuda(1)) == *device::cuda(0));
  CHECK_FALSE(v.reverse_map_for("nobody").has_value());
  // a sees one GPU only: b's map to a's cuda:1 cannot hold, and the view stays as it was.
  auto r = v.replace(group({worker("a", 0, "h", 1), b}));
  REQUIRE_FALSE(r.has_value());
  CHECK(v.get("a")->devices.device_count == 2);
  CHECK(v.reverse_map_for("b") == back);
}

TEST_CASE("a member view says which peers share this worker's host") {
  member_view v("a", group_kind::dynamic_group);
  REQUIRE(v.replace(group(
      {worker("a", 0, "h1"), worker("b", 1, "h1"), worker("c", 2, "h2"), worker("d", 3, "")})));
  CHECK(v.same_host("b"));
  CHECK_FALSE(v.same_host("c"));
  CHECK_FALSE(v.same_host("d"));  // its host is unknown
  CHECK_FALSE(v.same_host("z"));  // not a member
}
