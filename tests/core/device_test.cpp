#include <doctest/doctest.h>

#include <set>

#include <troupe/core/device.hpp>

using namespace troupe;

TEST_CASE("devices parse and print as cpu and cuda:N") {
  CHECK(device::parse("cpu")->is_cpu());
  auto d = device::parse("cuda:3");
  REQUIRE(d);
  CHECK(d->is_cuda());
  CHECK(d->index() == 3);
  CHECK(d->to_string() == "cuda:3");
  CHECK(device::parse("2")->to_string() == "cuda:2");
  CHECK(device::cpu().to_string() == "cpu");
}

TEST_CASE("a negative device index is refused") {
  auto d = device::cuda(-1);
  REQUIRE_FALSE(d);
  CHECK(d.error().message().find("Device index must not be negative") != std::string::npos);
  auto p = device::parse("cuda:-2");
  REQUIRE_FALSE(p);
  CHECK(p.error().message().find("Device index must not be negative") != std::string::npos);
}

TEST_CASE("malformed device strings are refused with the accepted forms") {
  for (const char* text : {"", "gpu:0", "cuda", "cuda:", "cuda:x", "cuda:1x", "cpu:0", " 1"}) {
    auto d = device::parse(text);
    CHECK_MESSAGE(!d, text);
    if (!d) {
      CHECK(d.error().code() == errc::invalid_argument);
      CHECK(d.error().message().find("cuda:N") != std::string::npos);
    }
  }
}

TEST_CASE("devices order cpu first then cuda by index") {
  std::set<device> s{*device::cuda(2), device::cpu(), *device::cuda(0)};
  std::vector<std::string> order;
  for (auto& d : s) order.push_back(d.to_string());
  CHECK(order == std::vector<std::string>{"cpu", "cuda:0", "cuda:2"});
}
