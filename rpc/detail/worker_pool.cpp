#include <troupe/rpc/detail/worker_pool.hpp>

#include <atomic>

#include <troupe/rpc/detail/spin_policy.hpp>

namespace troupe::rpc::detail {

namespace {
thread_local const worker_pool* current_pool = nullptr;
}

struct worker_pool::spin_state {
  explicit spin_state(std::chrono::microseconds spin) : policy(spin) {}
  std::atomic<std::size_t> pending{0};  // tasks queued, read by the spinner without the lock
  std::atomic<bool> spinning{false};    // one thread spins at a time
  spin_policy policy;                   // fed with the gaps between tasks
  clock::time_point last_post{};        // under mu_
};

worker_pool::worker_pool(std::size_t threads, std::chrono::microseconds spin)
    : state_(std::make_unique<spin_state>(spin)) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

worker_pool::~worker_pool() { stop(deadline::after(std::chrono::seconds(5))); }

bool worker_pool::post(task t) {
  std::size_t before = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(t));
    before = state_->pending.fetch_add(1, std::memory_order_acq_rel);
    // The spin policy learns how close together tasks come.
    const auto now = clock::now();
    if (state_->last_post != clock::time_point{}) state_->policy.record(now - state_->last_post);
    state_->last_post = now;
  }
  // A spinning thread takes a lone task without a wake-up. It clears `spinning` before it
  // locks mu_ to sleep, so one that stopped spinning either finds this task under the lock
  // or is seen here as not spinning and woken.
  if (before == 0 && state_->spinning.load()) return true;
  cv_.notify_one();
  return true;
}

bool worker_pool::on_pool_thread() const noexcept { return current_pool == this; }

void worker_pool::run() {
  current_pool = this;
  auto& st = *state_;
  for (;;) {
    if (st.pending.load(std::memory_order_acquire) == 0) {
      if (auto grant = st.policy.grant(); grant.count() > 0 && !st.spinning.exchange(true)) {
        spin_policy::spin_until(grant,
                                [&] { return st.pending.load(std::memory_order_acquire) != 0; });
        st.spinning.store(false);
      }
    }
    task t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      t = std::move(queue_.front());
      queue_.pop_front();
      st.pending.fetch_sub(1, std::memory_order_release);
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
