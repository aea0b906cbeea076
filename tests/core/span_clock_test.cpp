#include <doctest/doctest.h>

#include <thread>

#include <troupe/core/span_clock.hpp>

using namespace std::chrono_literals;
namespace span_clock = troupe::span_clock;
using steady = troupe::clock;

TEST_CASE(
    "time points from the span counter are never before the present and microseconds after "
    "it, across many rebases") {
  span_clock::stamper stamper;
  const auto start = steady::now();
  int points = 0;
  // About 30 ms: some 30 rebases of 1 ms, with points between them.
  while (steady::now() - start < 30ms && points < 5'000'000) {
    const auto before = steady::now();
    const auto p = stamper.now();
    const auto after = steady::now();
    ++points;
    REQUIRE(p.at >= before);
    REQUIRE(p.at <= after + span_clock::stamper::margin + 20us);
  }
  CHECK(points > 100);
}

TEST_CASE("a span timed with the span counter agrees with the steady clock") {
  span_clock::calibrate();
  for (auto span : {1ms, 20ms}) {
    CAPTURE(span.count());
    const auto t0 = steady::now();
    const auto c0 = span_clock::ticks();
    std::this_thread::sleep_for(span);
    const auto c1 = span_clock::ticks();
    const auto t1 = steady::now();
    const auto steady = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0);
    const auto counted = span_clock::between(c0, c1);
    // The two pairs of reads are a few hundred nanoseconds apart at most; the rate was
    // measured over 2 ms against the same clock.
    CHECK(counted.count() >= span_clock::between(0, 0).count());
    CHECK(counted <= steady + 20us);
    CHECK(counted >= steady - steady / 50 - 20us);
  }
  CHECK(span_clock::between(10, 5).count() == 0);
}
