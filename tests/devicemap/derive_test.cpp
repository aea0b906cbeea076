#include <doctest/doctest.h>

#include <vector>

#include <troupe/devicemap/derive.hpp>
#include "helpers.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

std::vector<worker_device_info> three_workers() {
  return {
      worker("w0", 4, {{"w1", dmap({{cuda(0), cuda(1)}, {cpu(), cpu()}})}}),
      worker("w1", 2, {{"w0", dmap({{cuda(1), cuda(3)}})}, {"w2", dmap({{cuda(0), cuda(2)}})}}),
      worker("w2", 4, {{"w1", dmap({{cuda(3), cuda(0)}})}}),
  };
}

}  // namespace

TEST_CASE("reverse maps invert every map that targets me, keyed by its owner") {
  auto all = three_workers();
  auto reverse = reverse_device_maps("w1", all);
  CHECK(reverse == device_maps{{"w0", dmap({{cuda(1), cuda(0)}, {cpu(), cpu()}})},
                               {"w2", dmap({{cuda(0), cuda(3)}})}});
  auto r0 = reverse_device_maps("w0", all);
  CHECK(r0 == device_maps{{"w1", dmap({{cuda(3), cuda(1)}})}});
}

TEST_CASE("a worker no one maps to has no reverse maps") {
  auto all = three_workers();
  all.push_back(worker("w3", 1));
  CHECK(reverse_device_maps("w3", all).empty());
  CHECK(reverse_device_maps("absent", all).empty());
}

TEST_CASE("an empty map that targets me gives an empty reverse map") {
  std::vector<worker_device_info> all{worker("w0", 1, {{"w1", device_map{}}}), worker("w1", 1)};
  auto reverse = reverse_device_maps("w1", all);
  REQUIRE(reverse.contains("w0"));
  CHECK(reverse.at("w0").empty());
}

TEST_CASE("a worker that maps to itself appears in its own reverse maps") {
  std::vector<worker_device_info> all{worker("w0", 2, {{"w0", dmap({{cuda(0), cuda(1)}})}})};
  CHECK(reverse_device_maps("w0", all) == device_maps{{"w0", dmap({{cuda(1), cuda(0)}})}});
}

TEST_CASE("the reverse of the reverse maps is the original for one-to-one maps") {
  auto all = three_workers();
  // Give every worker its reverse maps as its forward maps, then reverse again.
  std::vector<worker_device_info> flipped;
  for (const auto& w : all)
    flipped.push_back(worker(w.name, w.device_count, reverse_device_maps(w.name, all)));
  for (const auto& w : all) CHECK(reverse_device_maps(w.name, flipped) == w.maps);
}

TEST_CASE("an explicit device list is used as given, sorted") {
  auto me = worker("w0", 4, {{"w1", dmap({{cuda(2), cuda(0)}})}}, {cuda(3), cpu(), cuda(1)});
  device_maps reverse{{"w1", dmap({{cuda(0), cuda(0)}})}};
  CHECK(build_device_list(me, reverse) == std::vector<device>{cpu(), cuda(1), cuda(3)});
}

TEST_CASE("a derived device list is the union of my sources on both sides, without cpu") {
  auto me = worker("w0", 8,
                   {{"w1", dmap({{cuda(5), cuda(0)}, {cpu(), cpu()}})},
                    {"w2", dmap({{cuda(1), cuda(1)}, {cuda(5), cuda(2)}})}});
  device_maps reverse{{"w1", dmap({{cuda(3), cuda(0)}, {cpu(), cuda(1)}})},
                      {"w3", dmap({{cuda(0), cuda(7)}, {cuda(1), cuda(6)}})}};
  CHECK(build_device_list(me, reverse) == std::vector<device>{cuda(0), cuda(1), cuda(3), cuda(5)});
  CHECK(build_device_list(worker("w0", 0), {}).empty());
  CHECK(build_device_list(worker("w0", 0, {{"w1", dmap({{cpu(), cpu()}})}}), {}).empty());
}

TEST_CASE("resolving a device setup validates, then derives reverse maps and devices") {
  auto all = three_workers();
  auto setup = resolve_device_setup("w1", all, group_kind::static_group);
  REQUIRE(setup);
  CHECK(setup->reverse_maps == reverse_device_maps("w1", all));
  CHECK(setup->devices == std::vector<device>{cuda(0), cuda(1)});
}

TEST_CASE("resolving a device setup returns the validation error unchanged") {
  auto all = three_workers();
  all[2].maps["w1"] = dmap({{cuda(3), cuda(5)}});
  auto setup = resolve_device_setup("w1", all, group_kind::static_group);
  check_refused(setup, {"'w2'", "'w1'", "cuda:3 -> cuda:5", "device count 2", "cuda:0..cuda:1"});
}

TEST_CASE("resolving a device setup for a worker without a record is not found") {
  auto all = three_workers();
  auto setup = resolve_device_setup("w9", all, group_kind::dynamic_group);
  check_refused(setup, {"'w9'", "no device record"}, errc::not_found);
}
