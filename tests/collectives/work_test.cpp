#include <doctest/doctest.h>

#include <thread>

#include <troupe/collectives/work.hpp>

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::collectives;

TEST_CASE("a work completes once and reports its result to waits and futures") {
  auto [w, done] = work::make("allreduce #1 on group 'g'");
  CHECK_FALSE(w.is_completed());
  auto early = w.get_future();
  auto pending = w.wait(10ms);
  REQUIRE_FALSE(pending);
  CHECK(pending.error().code() == errc::timeout);
  CHECK(pending.error().message().find("allreduce #1") != std::string::npos);
  std::thread t([c = done] { c.complete(ok()); });
  CHECK(w.wait(5s));
  t.join();
  CHECK(w.is_completed());
  CHECK_FALSE(w.error());
  CHECK_FALSE(done.complete(make_error(errc::internal, "late")));
  CHECK(early.get(1s));
  CHECK(w.get_future().get(1s));
}

TEST_CASE("a failed work gives its error to wait, error and chained futures") {
  auto [w, done] = work::make("barrier #2");
  int ran = 0;
  auto chained = w.get_future().then([&] { ++ran; });
  done.complete(make_error(errc::connection_lost, "peer died"));
  auto r = w.wait(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::connection_lost);
  REQUIRE(w.error());
  CHECK(w.error()->message() == "peer died");
  auto c = chained.get(1s);
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == errc::connection_lost);
  CHECK(ran == 0);
}

TEST_CASE("an empty work handle is an error, not a hang") {
  work w;
  CHECK_FALSE(w.valid());
  CHECK(w.wait(1ms).error().code() == errc::invalid_argument);
  CHECK(work::completed(ok()).wait(1ms));
}
