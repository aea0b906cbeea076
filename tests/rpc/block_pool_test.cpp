// The pool behind the RPC agent's pinned host and device buffers, tested with malloc.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include <troupe/rpc/detail/block_pool.hpp>

using troupe::rpc::detail::block_pool;

namespace {

struct counting_heap {
  std::atomic<int> allocated{0};
  std::atomic<int> released{0};
  std::shared_ptr<block_pool> pool(std::size_t max_cached) {
    return block_pool::make(
        [this](std::size_t n) -> troupe::expected<void*> {
          ++allocated;
          return std::malloc(n);
        },
        [this](void* p) {
          ++released;
          std::free(p);
        },
        max_cached);
  }
};

}  // namespace

TEST_CASE("a freed block is reused by the next request of its size class") {
  counting_heap heap;
  auto pool = heap.pool(1 << 20);
  void* first = nullptr;
  {
    auto a = pool->get(5000).value();
    first = a.get();
  }
  CHECK(pool->cached_bytes() == 8192);
  auto b = pool->get(8000).value();  // same class (8 KiB)
  CHECK(b.get() == first);
  CHECK(heap.allocated == 1);
  CHECK(pool->hits() == 1);
  CHECK(pool->misses() == 1);
  auto c = pool->get(9000).value();  // the next class allocates
  CHECK(heap.allocated == 2);
}

TEST_CASE("the cache never holds more than its bound; the rest is released at once") {
  counting_heap heap;
  auto pool = heap.pool(16 << 10);
  {
    std::vector<std::shared_ptr<void>> held;
    for (int i = 0; i < 5; ++i) held.push_back(pool->get(4096).value());
  }
  CHECK(pool->cached_bytes() == (16 << 10));
  CHECK(heap.released == 1);
  { auto big = pool->get(1 << 20).value(); }
  CHECK(pool->cached_bytes() == (16 << 10));  // a 1 MiB block does not fit: released
  CHECK(heap.released == 2);
}

TEST_CASE("blocks outliving their pool are released, and the pool releases what it cached") {
  counting_heap heap;
  std::shared_ptr<void> survivor;
  {
    auto pool = heap.pool(1 << 20);
    survivor = pool->get(100).value();
    auto cached = pool->get(100).value();
  }  // the pool is gone: its cached block is released
  CHECK(heap.released == 1);
  survivor.reset();
  CHECK(heap.released == 2);
  CHECK(heap.allocated == 2);
}

TEST_CASE("an allocation failure is returned as the error") {
  auto pool = block_pool::make(
      [](std::size_t) -> troupe::expected<void*> {
        return troupe::make_error(troupe::errc::unavailable, "out of pinned memory");
      },
      [](void*) {}, 1 << 20);
  auto r = pool->get(10);
  REQUIRE_FALSE(r);
  CHECK(r.error().message() == "out of pinned memory");
}

TEST_CASE("threads getting and dropping blocks never share one and lose none") {
  counting_heap heap;
  auto pool = heap.pool(64 << 10);
  std::atomic<bool> shared{false};
  std::mutex mu;
  std::set<void*> live;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        auto b = pool->get(4096 * (1 + i % 3)).value();
        {
          std::lock_guard lk(mu);
          if (!live.insert(b.get()).second) shared = true;
        }
        std::lock_guard lk(mu);
        live.erase(b.get());
      }
    });
  for (auto& th : threads) th.join();
  CHECK_FALSE(shared);
  pool.reset();
  CHECK(heap.allocated == heap.released);
}
