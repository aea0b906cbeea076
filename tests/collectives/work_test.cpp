#include <doctest/doctest.h>

#include <memory>
#include <thread>
#include <vector>

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

TEST_CASE(
    "works made with shared hooks are helped on wait and urged by futures and polls, each with "
    "its own key, and not once they completed") {
  std::vector<std::uint64_t> helped, urged;
  auto hooks =
      std::make_shared<const work::hooks>(work::hooks{[&](std::uint64_t k) { helped.push_back(k); },
                                                      [&](std::uint64_t k) { urged.push_back(k); },
                                                      {}});
  auto [a, done_a] = work::make("allreduce #7", hooks, 7);
  auto [b, done_b] = work::make("broadcast #8", hooks, 8);
  CHECK(done_b.description() == "broadcast #8");
  CHECK_FALSE(b.is_completed());  // urges 8
  auto f = b.get_future();        // urges 8
  // A wait that the help does not complete urges too, then waits.
  CHECK(a.wait(1ms).error().code() == errc::timeout);
  CHECK(helped == std::vector<std::uint64_t>{7});
  CHECK(urged == std::vector<std::uint64_t>{8, 8, 7});
  done_a.complete(ok());
  done_b.complete(ok());
  CHECK(a.wait(1s));
  CHECK(b.is_completed());
  CHECK(f.get(1s));
  CHECK(helped.size() == 1);
  CHECK(urged.size() == 3);
}

TEST_CASE("a work made from an operation, its number and its group describes itself when asked") {
  auto where =
      std::make_shared<const work::hooks>(work::hooks{{}, {}, "group 'g' (gloo, rank 0 of 2)"});
  auto [w, done] = work::make_lazy("allreduce", where, 12);
  CHECK(w.description() == "allreduce #12 on group 'g' (gloo, rank 0 of 2)");
  CHECK(done.description() == w.description());
  auto late = w.wait(1ms);
  REQUIRE_FALSE(late);
  CHECK(late.error().message().find("allreduce #12 on group 'g'") != std::string::npos);
  done.complete(ok());
  CHECK(w.wait(1s));
}

TEST_CASE(
    "a work made lazily from shared hooks is helped with its key, describes itself by their "
    "place, and outlives every handle but the last") {
  std::vector<std::uint64_t> helped;
  auto hooks = std::make_shared<const work::hooks>(
      work::hooks{[&](std::uint64_t k) { helped.push_back(k); }, {}, "group 'h' (gloo)"});
  auto [w, done] = work::make_lazy("broadcast", hooks, 5);
  hooks.reset();  // the work keeps them
  CHECK(w.description() == "broadcast #5 on group 'h' (gloo)");
  work copy = w;
  w = work{};
  CHECK_FALSE(w.valid());
  CHECK(copy.wait(1ms).error().code() == errc::timeout);
  CHECK(helped == std::vector<std::uint64_t>{5});
  done.complete(make_error(errc::aborted, "stopped"));
  done = work::completer{};  // the completer goes first: the result stays with the work
  REQUIRE(copy.error());
  CHECK(copy.error()->message() == "stopped");
  CHECK(copy.description() == "broadcast #5 on group 'h' (gloo)");
}
