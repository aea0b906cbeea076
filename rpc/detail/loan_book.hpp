// loan_book: the GPU tensors this worker has lent to workers on its host through CUDA IPC
// (rpc/device_helper.hpp), each kept alive until its receiver releases it
// (wire::kind::ipc_release). A loan nobody releases (a receiver that died mid-copy) is
// dropped once it is older than the expiry, checked whenever a loan is filed and by the
// agent's sweeper. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <troupe/core/time.hpp>
#include <troupe/rpc/routing.hpp>

namespace troupe::rpc::detail {

class loan_book final : public ipc_lender {
 public:
  explicit loan_book(duration expiry) : expiry_(expiry) {}

  std::uint64_t next_loan_id() override;
  void file_loan(std::uint64_t id, std::shared_ptr<void> keep) override;

  /// Drops loan `id`; false when it is unknown (released already, expired, or never lent).
  bool release(std::uint64_t id);
  /// Drops loans older than the expiry at `now`; returns how many.
  std::size_t expire(clock::time_point now);
  /// Drops every loan (the agent is gone; no receiver can read them any more).
  void clear();
  std::size_t size() const;

 private:
  struct loan {
    std::shared_ptr<void> keep;
    clock::time_point filed;
  };
  duration expiry_;
  mutable std::mutex mu_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, loan> loans_;
};

}  // namespace troupe::rpc::detail
