#include <doctest/doctest.h>

#include <vector>

#include <troupe/devicemap/validate.hpp>
#include "helpers.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

constexpr auto static_group = group_kind::static_group;
constexpr auto dynamic_group = group_kind::dynamic_group;

expected<void> validate(const std::vector<worker_device_info>& all, group_kind kind) {
  return validate_device_maps(all, kind);
}

}  // namespace

TEST_CASE("a well-formed group passes in both kinds") {
  std::vector<worker_device_info> all{
      worker("w0", 2, {{"w1", dmap({{cuda(0), cuda(1)}, {cuda(1), cuda(0)}, {cpu(), cpu()}})}}),
      worker("w1", 2, {{"w0", dmap({{cuda(1), cuda(1)}})}}, {cuda(0), cuda(1), cpu()}),
  };
  CHECK(validate(all, static_group));
  CHECK(validate(all, dynamic_group));
  CHECK(validate({}, static_group));
  // cpu needs no listing: device lists name GPUs, and cpu exists on every worker.
  all[1].devices.pop_back();
  CHECK(validate(all, static_group));
}

TEST_CASE("two records with one name are refused") {
  std::vector<worker_device_info> all{worker("w0", 1), worker("w1", 1), worker("w0", 2)};
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "twice", "records 0 and 2", "unique name"});
  CHECK(r.error().worker() == "w0");
}

TEST_CASE("a negative device count is refused") {
  check_refused(validate({worker("w0", -1)}, dynamic_group), {"'w0'", "device count -1"});
}

TEST_CASE("a device listed twice is refused") {
  CHECK(validate({worker("w0", 2, {}, {cuda(1), cuda(0)})}, static_group));
  auto r = validate({worker("w0", 2, {}, {cuda(1), cuda(0), cuda(1)})}, static_group);
  check_refused(r, {"'w0'", "cuda:1 twice", "[cuda:1, cuda:0, cuda:1]", "list each device once"});
  check_refused(validate({worker("w0", 0, {}, {cpu(), cpu()})}, dynamic_group), {"cpu twice"});
}

TEST_CASE("a listed device beyond the device count is refused") {
  CHECK(validate({worker("w0", 4, {}, {cpu(), cuda(3)})}, static_group));
  auto r = validate({worker("w0", 4, {}, {cuda(0), cuda(4)})}, static_group);
  check_refused(r, {"'w0'", "cuda:4", "device count 4", "cuda:0..cuda:3", "remove cuda:4"});
  check_refused(validate({worker("w0", 1, {}, {cuda(1)})}, static_group),
                {"device count 1", "cpu and cuda:0;"});
  check_refused(validate({worker("w0", 0, {}, {cuda(0)})}, dynamic_group),
                {"device count 0", "cpu only"});
}

TEST_CASE("a map to a worker outside a static group is refused") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"w9", dmap({{cuda(0), cuda(0)}})}}),
      worker("w1", 1),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w9'", "{cuda:0 -> cuda:0}", "[w0, w1]", "correct the target name"});
  CHECK(r.error().worker() == "w0");
}

TEST_CASE("a map to a worker that has not joined a dynamic group is accepted") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"later", dmap({{cuda(0), cuda(0)}})}}),
      worker("w1", 1),
  };
  CHECK(validate(all, dynamic_group));
}

TEST_CASE("target devices of a worker that has not joined a dynamic group are not checked") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"later", dmap({{cuda(0), cuda(99)}, {cpu(), cuda(98)}})}}),
  };
  CHECK(validate(all, dynamic_group));
  // Its source devices still are.
  all[0].maps["later"] = dmap({{cuda(1), cuda(0)}});
  check_refused(validate(all, dynamic_group), {"'w0'", "'later'", "cuda:1 -> cuda:0"});
}

TEST_CASE("two sources sending to one target device are refused") {
  std::vector<worker_device_info> all{
      worker("w0", 4, {{"w1", dmap({{cuda(0), cuda(1)}, {cuda(2), cuda(1)}})}}),
      worker("w1", 4),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w1'", "cuda:0 -> cuda:1", "cuda:2 -> cuda:1",
                    "{cuda:0 -> cuda:1, cuda:2 -> cuda:1}", "give cuda:2 another target"});
  all[0].maps["w1"] = dmap({{cuda(0), cuda(1)}, {cuda(2), cuda(0)}});
  CHECK(validate(all, static_group));
}

TEST_CASE("a source outside the worker's device list is refused") {
  std::vector<worker_device_info> all{
      worker("w0", 4, {{"w1", dmap({{cuda(2), cuda(0)}})}}, {cuda(0), cuda(1)}),
      worker("w1", 4),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w1'", "cuda:2 -> cuda:0", "device list of 'w0'", "[cuda:0, cuda:1]",
                    "add cuda:2"});
  all[0].devices.push_back(cuda(2));
  CHECK(validate(all, static_group));
}

TEST_CASE("cpu entries need not be in a device list on either side") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"w1", dmap({{cpu(), cpu()}, {cuda(0), cuda(0)}})}}, {cuda(0)}),
      worker("w1", 1, {}, {cuda(0)}),
  };
  CHECK(validate(all, static_group));
  all[0].maps["w1"] = dmap({{cuda(0), cpu()}});
  CHECK(validate(all, static_group));
}

TEST_CASE("a source beyond the worker's device count is refused") {
  std::vector<worker_device_info> all{
      worker("w0", 4, {{"w1", dmap({{cuda(5), cuda(0)}})}}),
      worker("w1", 4),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w1'", "cuda:5 -> cuda:0", "device count 4", "cuda:0..cuda:3",
                    "exists on 'w0'"});
  all[0].maps["w1"] = dmap({{cuda(3), cuda(0)}});
  CHECK(validate(all, static_group));
}

TEST_CASE("a target outside the target's device list is refused") {
  std::vector<worker_device_info> all{
      worker("w0", 4, {{"w1", dmap({{cuda(0), cuda(3)}})}}),
      worker("w1", 4, {}, {cuda(0), cuda(1)}),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w1'", "cuda:0 -> cuda:3", "device list of 'w1'", "[cuda:0, cuda:1]",
                    "add cuda:3"});
  CHECK(r.error().worker() == "w0");
  check_refused(validate(all, dynamic_group), {"cuda:0 -> cuda:3"});
  all[1].devices.push_back(cuda(3));
  CHECK(validate(all, static_group));
}

TEST_CASE("a target beyond the target's device count is refused") {
  std::vector<worker_device_info> all{
      worker("w0", 4, {{"w1", dmap({{cuda(0), cuda(7)}})}}),
      worker("w1", 4),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w0'", "'w1'", "cuda:0 -> cuda:7", "device count 4", "cuda:0..cuda:3",
                    "exists on 'w1'"});
  check_refused(validate(all, dynamic_group), {"cuda:0 -> cuda:7"});
  all[0].maps["w1"] = dmap({{cuda(0), cuda(3)}});
  CHECK(validate(all, static_group));
}

TEST_CASE("cpu entries are valid on both sides, even without GPUs") {
  std::vector<worker_device_info> all{
      worker("w0", 0, {{"w1", dmap({{cpu(), cpu()}})}}),
      worker("w1", 0, {{"w0", dmap({{cpu(), cpu()}})}}, {cpu()}),
  };
  CHECK(validate(all, static_group));
  CHECK(validate(all, dynamic_group));
}

TEST_CASE("a worker may map devices to itself") {
  CHECK(validate({worker("w0", 2, {{"w0", dmap({{cuda(0), cuda(1)}})}})}, static_group));
}

TEST_CASE("device list problems are reported before any map problem") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"w1", dmap({{cuda(5), cuda(0)}})}}),
      worker("w1", 1, {}, {cuda(2)}),
  };
  auto r = validate(all, static_group);
  check_refused(r, {"'w1' lists cuda:2"});
  CHECK(r.error().worker() == "w1");
}

TEST_CASE("an unknown target name is reported before problems in other maps of that worker") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"a", dmap({{cuda(5), cuda(0)}})}, {"zz", device_map{}}}),
      worker("a", 1),
  };
  check_refused(validate(all, static_group), {"'zz'"});
  check_refused(validate(all, dynamic_group), {"cuda:5 -> cuda:0"});
}

TEST_CASE("the first faulty worker in the given order is the one reported") {
  std::vector<worker_device_info> all{
      worker("w0", 1, {{"w1", dmap({{cuda(3), cuda(0)}})}}),
      worker("w1", 1, {{"w0", dmap({{cuda(4), cuda(0)}})}}),
  };
  auto first = validate(all, static_group);
  check_refused(first, {"cuda:3 -> cuda:0"});
  CHECK(first.error().worker() == "w0");
  std::swap(all[0], all[1]);
  auto second = validate(all, static_group);
  check_refused(second, {"cuda:4 -> cuda:0"});
  CHECK(second.error().worker() == "w1");
}

TEST_CASE("within a map the entry with the smallest source is reported first") {
  std::vector<worker_device_info> all{
      worker("w0", 2,
             {{"b", dmap({{cuda(9), cuda(0)}, {cuda(8), cuda(1)}})},
              {"a", dmap({{cuda(0), cuda(7)}})}}),
      worker("a", 2),
      worker("b", 2),
  };
  // Target "a" comes first in name order; its bad target index is reported.
  check_refused(validate(all, static_group), {"'a'", "cuda:0 -> cuda:7"});
  all[0].maps.erase("a");
  check_refused(validate(all, static_group), {"'b'", "cuda:8 -> cuda:1"});
}

TEST_CASE("validation errors carry the worker and the operation") {
  auto r = validate({worker("w0", 0, {}, {cuda(0)})}, static_group);
  REQUIRE_FALSE(r);
  CHECK(r.error().worker() == "w0");
  CHECK(r.error().operation() == "validate_device_maps");
}

TEST_CASE("devices are valid when cpu or a cuda index below the count") {
  CHECK(is_valid_device(cpu(), 0));
  CHECK(is_valid_device(cuda(0), 1));
  CHECK_FALSE(is_valid_device(cuda(1), 1));
  CHECK_FALSE(is_valid_device(cuda(0), 0));
}
