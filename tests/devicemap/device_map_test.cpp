#include <doctest/doctest.h>

#include <sstream>

#include <troupe/devicemap/device_map.hpp>
#include "helpers.hpp"

using namespace troupe;
using namespace troupe::test;

TEST_CASE("a source mapped to two targets is refused") {
  device_map m;
  REQUIRE(m.set(cuda(0), cuda(1)));
  auto r = m.set(cuda(0), cuda(2));
  check_refused(r, {"cuda:0", "cuda:1", "cuda:2", "one target"});
  CHECK(m.size() == 1);
  CHECK(m.find(cuda(0)) == cuda(1));
}

TEST_CASE("setting the same pair twice is accepted and keeps one entry") {
  device_map m;
  REQUIRE(m.set(cuda(0), cuda(1)));
  REQUIRE(m.set(cuda(0), cuda(1)));
  CHECK(m.size() == 1);
}

TEST_CASE("two sources may share a target inside one map until validation refuses it") {
  device_map m;
  REQUIRE(m.set(cuda(0), cuda(1)));
  CHECK(m.set(cuda(2), cuda(1)));
  CHECK(m.size() == 2);
}

TEST_CASE("an unmapped source is not found") {
  auto m = dmap({{cpu(), cpu()}});
  CHECK(m.contains(cpu()));
  CHECK_FALSE(m.contains(cuda(0)));
  CHECK(m.find(cuda(0)) == std::nullopt);
}

TEST_CASE("a device map prints its entries in source order") {
  auto m = dmap({{cuda(0), cuda(1)}, {cpu(), cpu()}, {cuda(3), cuda(0)}});
  CHECK(to_string(m) == "{cpu -> cpu, cuda:0 -> cuda:1, cuda:3 -> cuda:0}");
  std::ostringstream os;
  os << m;
  CHECK(os.str() == to_string(m));
  CHECK(to_string(device_map{}) == "{}");
}

TEST_CASE("device maps and device lists print with names and brackets") {
  device_maps maps{{"w2", dmap({{cuda(0), cuda(1)}})}, {"w1", device_map{}}};
  CHECK(to_string(maps) == "{w1: {}, w2: {cuda:0 -> cuda:1}}");
  std::vector<device> list{cuda(1), cpu()};
  CHECK(to_string(list) == "[cuda:1, cpu]");
  CHECK(to_string(std::vector<device>{}) == "[]");
}

TEST_CASE("inverting a one-to-one map twice gives it back") {
  auto m = dmap({{cuda(0), cuda(3)}, {cpu(), cpu()}, {cuda(1), cuda(0)}});
  auto inv = invert(m);
  CHECK(inv.find(cuda(3)) == cuda(0));
  CHECK(inv.find(cuda(0)) == cuda(1));
  CHECK(inv.find(cpu()) == cpu());
  CHECK(invert(inv) == m);
}

TEST_CASE("inverting a map with a shared target keeps the smaller source") {
  auto m = dmap({{cuda(2), cuda(0)}, {cuda(1), cuda(0)}});
  auto inv = invert(m);
  CHECK(inv.size() == 1);
  CHECK(inv.find(cuda(0)) == cuda(1));
}
