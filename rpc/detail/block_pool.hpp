// block_pool: a bounded cache of freed memory blocks, so that tensors crossing the wire do
// not allocate pinned host or device memory per message. Blocks are rounded up to a size
// class (powers of two from 4 KiB); a freed block waits in its class for the next request
// of that class, and the cache as a whole never holds more than `max_cached` bytes (a free
// that would exceed it releases the block at once). The allocation functions are given by
// the user (cudaMallocHost / cudaFreeHost, cudaMalloc / cudaFree on one device), so the
// logic is tested on the host with malloc and free.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe::rpc::detail {

class block_pool : public std::enable_shared_from_this<block_pool> {
 public:
  /// Returns memory of at least `bytes` bytes, or an error naming why it cannot.
  using allocate_fn = std::function<expected<void*>(std::size_t bytes)>;
  using release_fn = std::function<void(void*)>;

  static std::shared_ptr<block_pool> make(allocate_fn allocate, release_fn release,
                                          std::size_t max_cached) {
    return std::shared_ptr<block_pool>(
        new block_pool(std::move(allocate), std::move(release), max_cached));
  }

  ~block_pool() {
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) release_(p);
  }
  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;

  /// The size class of a request: the next power of two from 4 KiB up.
  static std::size_t size_class(std::size_t bytes) noexcept {
    std::size_t c = 4096;
    while (c < bytes) c <<= 1;
    return c;
  }

  /// A block of at least `bytes`, owned by the result: dropping the last copy of the
  /// pointer returns it to this pool (or releases it when the cache is full or the pool
  /// is gone).
  expected<std::shared_ptr<void>> get(std::size_t bytes) {
    const std::size_t c = size_class(bytes);
    void* p = nullptr;
    {
      std::lock_guard lk(mu_);
      if (auto it = free_.find(c); it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= c;
        ++hits_;
      }
    }
    if (p == nullptr) {
      auto fresh = allocate_(c);
      if (!fresh) return std::move(fresh).error();
      p = *fresh;
      std::lock_guard lk(mu_);
      ++misses_;
    }
    std::weak_ptr<block_pool> weak = weak_from_this();
    release_fn release = release_;
    return std::shared_ptr<void>(p, [weak, release, c](void* q) {
      if (auto pool = weak.lock()) return pool->put(q, c);
      release(q);
    });
  }

  /// Bytes held in the cache now.
  std::size_t cached_bytes() const {
    std::lock_guard lk(mu_);
    return cached_;
  }
  /// Requests served from the cache, and requests that allocated.
  std::size_t hits() const {
    std::lock_guard lk(mu_);
    return hits_;
  }
  std::size_t misses() const {
    std::lock_guard lk(mu_);
    return misses_;
  }

 private:
  block_pool(allocate_fn allocate, release_fn release, std::size_t max_cached)
      : allocate_(std::move(allocate)), release_(std::move(release)), max_cached_(max_cached) {}

  void put(void* p, std::size_t c) {
    {
      std::lock_guard lk(mu_);
      if (cached_ + c <= max_cached_) {
        free_[c].push_back(p);
        cached_ += c;
        return;
      }
    }
    release_(p);
  }

  allocate_fn allocate_;
  release_fn release_;
  const std::size_t max_cached_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
  std::size_t hits_ = 0;
  std::size_t misses_ = 0;
};

}  // namespace troupe::rpc::detail
