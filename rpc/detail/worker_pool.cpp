#include <troupe/rpc/detail/worker_pool.hpp>

#include <atomic>

namespace troupe::rpc::detail {

namespace {
thread_local const worker_pool* current_pool = nullptr;
}

struct worker_pool::atomic_size {
  std::atomic<std::size_t> n{0};
};

worker_pool::worker_pool(std::size_t threads, std::chrono::microseconds spin)
    : spin_(spin), pending_(std::make_unique<atomic_size>()) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

worker_pool::~worker_pool() { stop(deadline::after(std::chrono::seconds(5))); }

bool worker_pool::post(task t) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(t));
    pending_->n.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  return true;
}

bool worker_pool::on_pool_thread() const noexcept { return current_pool == this; }

void worker_pool::run() {
  current_pool = this;
  for (;;) {
    if (spin_.count() > 0 && pending_->n.load(std::memory_order_acquire) == 0) {
      auto until = clock::now() + spin_;
      while (pending_->n.load(std::memory_order_acquire) == 0 && clock::now() < until)
        std::this_thread::yield();
    }
    task t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      t = std::move(queue_.front());
      queue_.pop_front();
      pending_->n.fetch_sub(1, std::memory_order_release);
    }
    t();
  }
}

void worker_pool::stop(deadline d) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  // Threads drain the queue and exit; past the deadline the rest is dropped.
  while (!d.expired()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::deque<task> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    dropped.swap(queue_);
  }
  dropped.clear();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

}  // namespace troupe::rpc::detail
