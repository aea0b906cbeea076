#include <doctest/doctest.h>

#include <memory>

#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>

using namespace troupe;

TEST_CASE("an error prints its code, operation, worker and message") {
  auto e = make_error(errc::timeout, "waited ", 3, " s for key 'k'");
  e.with_operation("store.get").with_worker("trainer1");
  CHECK(e.to_string() == "timeout in store.get on worker 'trainer1': waited 3 s for key 'k'");
}

TEST_CASE("the innermost context is kept when context is added twice") {
  error e(errc::not_found, "no such key");
  e.with_worker("inner").with_worker("outer");
  CHECK(e.worker() == "inner");
}

TEST_CASE("every error code has a name that reads back to the same code") {
  for (int i = 1; i <= static_cast<int>(errc::membership_changed); ++i) {
    auto code = static_cast<errc>(i);
    errc back{};
    REQUIRE(from_string(to_string(code), back));
    CHECK(back == code);
    CHECK(to_string(code) != "unknown_error");
  }
  errc dummy{};
  CHECK_FALSE(from_string("no_such_code", dummy));
}

TEST_CASE("expected holds a value or an error and value() throws the error") {
  expected<int> good = 4;
  REQUIRE(good);
  CHECK(*good == 4);
  expected<int> bad = error(errc::invalid_argument, "nope");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.value_or(7) == 7);
  CHECK_THROWS_AS(bad.value(), exception);
  try {
    (void)bad.value();
  } catch (const exception& ex) {
    CHECK(ex.code() == errc::invalid_argument);
  }
}

TEST_CASE("expected<void> reports success or the error") {
  expected<void> fine;
  CHECK(fine);
  expected<void> broken = error(errc::aborted, "stopped");
  CHECK_FALSE(broken);
  CHECK(broken.error().message() == "stopped");
}

namespace {
expected<int> half(int x) {
  if (x % 2) return make_error(errc::invalid_argument, x, " is odd");
  return x / 2;
}
expected<int> quarter(int x) {
  auto h = half(x);
  TROUPE_TRY(h);
  return half(*h);
}
}  // namespace

TEST_CASE("TROUPE_TRY returns the first error from a chain of fallible steps") {
  CHECK(*quarter(8) == 2);
  auto r = quarter(6);
  REQUIRE_FALSE(r);
  CHECK(r.error().message() == "3 is odd");
}

TEST_CASE("expected moves out move-only values") {
  expected<std::unique_ptr<int>> p = std::make_unique<int>(5);
  auto owned = std::move(p).value();
  CHECK(*owned == 5);
}
