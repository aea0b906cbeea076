#include <doctest/doctest.h>

#include <troupe/core/worker_info.hpp>

using namespace troupe;

TEST_CASE("worker names of letters, digits and _-.: are accepted") {
  CHECK(validate_worker_name("trainer0"));
  CHECK(validate_worker_name("ps-1.node:a_b"));
}

TEST_CASE("empty, over-long and slash-containing worker names are refused") {
  CHECK_FALSE(validate_worker_name(""));
  CHECK_FALSE(validate_worker_name(std::string(200, 'a')));
  auto slash = validate_worker_name("a/b");
  REQUIRE_FALSE(slash);
  CHECK(slash.error().message().find("'/'") != std::string::npos);
}
