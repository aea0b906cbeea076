#include <doctest/doctest.h>

#include <array>
#include <memory>
#include <string>
#include <utility>

#include <troupe/core/unique_function.hpp>

using namespace troupe;

namespace {

// Counts the live copies of a callable, to see that every one is destroyed exactly once.
struct counted {
  explicit counted(int* live) : live(live) { ++*live; }
  counted(const counted& o) : live(o.live) { ++*live; }
  counted(counted&& o) noexcept : live(o.live) { ++*live; }
  ~counted() { --*live; }
  int* live;
};

}  // namespace

TEST_CASE("a unique_function calls what it holds, small or large, and moves it along") {
  unique_function<int(int)> empty;
  CHECK_FALSE(empty);

  int base = 10;
  unique_function<int(int)> small = [&base](int x) { return base + x; };
  REQUIRE(small);
  CHECK(small(5) == 15);

  std::array<int, 64> table{};  // 256 bytes: larger than the inline space, so on the heap
  table[3] = 42;
  unique_function<int(int)> large = [table](int i) { return table[static_cast<std::size_t>(i)]; };
  CHECK(large(3) == 42);

  auto moved = std::move(large);
  CHECK_FALSE(large);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  CHECK(moved(3) == 42);
  moved = std::move(small);
  CHECK_FALSE(small);  // NOLINT(bugprone-use-after-move)
  CHECK(moved(1) == 11);
}

TEST_CASE("a unique_function owns move-only callables and destroys each exactly once") {
  auto p = std::make_unique<std::string>("owned");
  unique_function<std::string()> f = [p = std::move(p)] { return *p; };
  auto g = std::move(f);
  CHECK(g() == "owned");

  int live = 0;
  {
    unique_function<void()> inline_held = [c = counted(&live)] { (void)c; };
    std::array<char, 200> pad{};
    unique_function<void()> heap_held = [c = counted(&live), pad] { (void)c, (void)pad; };
    CHECK(live == 2);
    auto a = std::move(inline_held);
    auto b = std::move(heap_held);
    CHECK(live == 2);  // the moved-from ones hold nothing
    a = std::move(b);  // a's callable is destroyed, b's moves in
    CHECK(live == 1);
    a = nullptr;
    CHECK(live == 0);
  }
  CHECK(live == 0);
}
