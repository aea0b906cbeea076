#include <doctest/doctest.h>

#include <memory>
#include <string>

#include <troupe/core/future.hpp>

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("a future returns the value its promise was given") {
  promise<int> p;
  auto f = p.get_future();
  CHECK_FALSE(f.is_ready());
  CHECK(p.set_value(42));
  CHECK(f.is_ready());
  auto r = f.get(1s);
  REQUIRE(r);
  CHECK(*r == 42);
  CHECK_FALSE(f.valid());
}

TEST_CASE("a promise is set only once") {
  promise<int> p;
  auto f = p.get_future();
  CHECK(p.set_value(1));
  CHECK_FALSE(p.set_value(2));
  CHECK_FALSE(p.set_error(error(errc::aborted, "late")));
  CHECK(*f.get(1s) == 1);
}

TEST_CASE("get times out with errc::timeout and the future can be waited on again") {
  promise<std::string> p;
  auto f = p.get_future();
  auto r = f.get(10ms);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::timeout);
  CHECK(f.valid());
  p.set_value("late");
  CHECK(*f.get(1s) == "late");
}

TEST_CASE("a dropped promise breaks its future instead of leaving it waiting") {
  future<int> f;
  {
    promise<int> p;
    f = p.get_future();
  }
  auto r = f.get(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::broken_promise);
}

TEST_CASE("then chains a transformation on the value") {
  promise<int> p;
  auto f = p.get_future().then([](int x) { return x * 2; }).then([](int x) {
    return std::to_string(x);
  });
  p.set_value(21);
  CHECK(*f.get(1s) == "42");
}

TEST_CASE("a continuation attached after completion runs inline") {
  auto f = make_ready_future(5);
  bool ran = false;
  auto g = std::move(f).then([&](int x) {
    ran = true;
    return x + 1;
  });
  CHECK(ran);
  CHECK(*g.get(1s) == 6);
}

TEST_CASE("errors skip then and reach the end of the chain") {
  promise<int> p;
  int calls = 0;
  auto f = p.get_future().then([&](int x) {
    ++calls;
    return x;
  });
  p.set_error(make_error(errc::connection_lost, "peer gone"));
  auto r = f.get(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::connection_lost);
  CHECK(calls == 0);
}

TEST_CASE("handle sees errors and can recover from them") {
  auto f = make_error_future<int>(error(errc::not_found, "missing")).handle([](expected<int>&& r) {
    return r ? *r : -1;
  });
  CHECK(*f.get(1s) == -1);
}

TEST_CASE("a continuation returning expected flattens into the next future") {
  auto f = make_ready_future(3).then([](int x) -> expected<int> {
    if (x > 2) return make_error(errc::invalid_argument, "too big");
    return x;
  });
  auto r = f.get(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().message() == "too big");
}

TEST_CASE("a continuation returning a future is flattened") {
  promise<int> inner;
  auto inner_f = inner.get_future();
  auto f = make_ready_future(1).then([&](int) { return std::move(inner_f); });
  CHECK_FALSE(f.is_ready());
  inner.set_value(9);
  CHECK(*f.get(1s) == 9);
}

TEST_CASE("an exception thrown in a continuation becomes the next future's error") {
  auto f = make_ready_future(1).then([](int) -> int { throw std::runtime_error("boom"); });
  auto r = f.get(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::user_error);
  CHECK(r.error().message() == "boom");
  auto g =
      make_ready_future(1).then([](int) -> int { throw exception(error(errc::aborted, "stop")); });
  CHECK(g.get(1s).error().code() == errc::aborted);
}

TEST_CASE("void futures chain and complete") {
  promise<void> p;
  int seen = 0;
  auto f = p.get_future().then([&] { seen = 1; });
  p.set_value();
  CHECK(f.get(1s));
  CHECK(seen == 1);
}

TEST_CASE("continuations may own move-only values") {
  auto owned = std::make_unique<int>(7);
  auto f = make_ready_future(1).then([o = std::move(owned)](int x) { return *o + x; });
  CHECK(*f.get(1s) == 8);
}

TEST_CASE("a consumed future reports misuse instead of crashing") {
  auto f = make_ready_future(1);
  (void)f.get(1s);
  auto again = f.get(1s);
  REQUIRE_FALSE(again);
  CHECK(again.error().code() == errc::invalid_argument);
}

TEST_CASE("when_all gathers values in order") {
  std::vector<promise<int>> ps(3);
  std::vector<future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto all = when_all(std::move(fs));
  ps[2].set_value(3);
  ps[0].set_value(1);
  CHECK_FALSE(all.is_ready());
  ps[1].set_value(2);
  auto r = all.get(1s);
  REQUIRE(r);
  CHECK(*r == std::vector<int>{1, 2, 3});
}

TEST_CASE("when_all fails as soon as one future fails") {
  std::vector<promise<void>> ps(2);
  std::vector<future<void>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto all = when_all(std::move(fs));
  ps[1].set_error(error(errc::peer_left, "rank 1 left"));
  auto r = all.get(1s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::peer_left);
  ps[0].set_value();
}

TEST_CASE("when_all of nothing is ready at once") {
  auto all = when_all(std::vector<future<int>>{});
  CHECK(all.is_ready());
  CHECK(all.get(1s)->empty());
}
