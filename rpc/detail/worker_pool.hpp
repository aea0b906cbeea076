// worker_pool: the threads that run user functions (never the I/O threads). A FIFO queue
// under one mutex. A thread that runs out of work may spin up to `spin` before sleeping,
// while tasks have recently come close together (spin_policy.hpp, fed with the gaps
// between posts), and only one thread
// spins at a time: a burst of short calls skips the wake-up of a sleeping thread, and an
// idle or slow-paced pool costs no CPU.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <troupe/core/time.hpp>
#include <troupe/core/unique_function.hpp>

namespace troupe::rpc::detail {

class worker_pool {
 public:
  using task = unique_function<void()>;

  /// Starts `threads` threads (at least one).
  worker_pool(std::size_t threads, std::chrono::microseconds spin);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /// Queues `t`; false once stopped (the task is dropped, which breaks its promises).
  bool post(task t);
  /// Runs what is queued, then joins the threads; tasks still queued after `d` are dropped.
  /// Idempotent. Must not be called from a pool thread.
  void stop(deadline d);
  /// True on one of this pool's threads.
  bool on_pool_thread() const noexcept;

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  struct spin_state;
  std::unique_ptr<spin_state> state_;
};

}  // namespace troupe::rpc::detail
