#include <doctest/doctest.h>

#include <troupe/core/time.hpp>

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("durations parse with units and print in the shortest exact unit") {
  CHECK(*parse_duration("250ms") == 250ms);
  CHECK(*parse_duration("30s") == 30s);
  CHECK(*parse_duration("30") == 30s);
  CHECK(*parse_duration("5m") == 5min);
  CHECK(*parse_duration("2h") == 2h);
  CHECK(*parse_duration("0.1") == 100ms);
  CHECK(*parse_duration(".5") == 500ms);
  CHECK(*parse_duration("1.5s") == 1500ms);
  CHECK(*parse_duration("2.25m") == 135s);
  CHECK(*parse_duration("0.0004") == 0ms);
  CHECK(format_duration(1500ms) == "1500ms");
  CHECK(format_duration(120s) == "2m");
  CHECK(format_duration(0ms) == "0ms");
}

TEST_CASE("bad durations are refused with the input quoted") {
  for (const char* text :
       {"", "-1s", "abc", "5 parsecs", "10d", "99999999999999999999h", "1.", "1.s", ".", "0.1.2"}) {
    auto d = parse_duration(text);
    CHECK_MESSAGE(!d, text);
    if (!d) CHECK(d.error().message().find(std::string("'") + text + "'") != std::string::npos);
  }
}

TEST_CASE("a deadline reports its remaining time and expiry") {
  auto d = deadline::after(50ms);
  CHECK_FALSE(d.expired());
  CHECK(d.remaining() <= 50ms);
  CHECK(deadline::after(0ms).expired());
  CHECK(deadline::after(0ms).remaining() == 0ms);
  CHECK_FALSE(deadline::never().expired());
  CHECK_FALSE(deadline::after(duration::max()).expired());
}

TEST_CASE("the default timeout can be changed but not to zero") {
  auto before = default_timeout();
  CHECK(set_default_timeout(7s));
  CHECK(default_timeout() == 7s);
  CHECK_FALSE(set_default_timeout(0ms));
  CHECK(set_default_timeout(before));
}
