// interruptible_store: a store decorator whose waiting calls end early when a condition
// says so. Internal to collectives/ (elastic_group builds each epoch's group through one,
// so that a build waiting for a member that died ends when the next epoch arrives instead
// of at its timeout).
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include <troupe/store/store.hpp>

namespace troupe::collectives {

class interruptible_store final : public store {
 public:
  /// Returns the error to end waits with, or nothing to go on waiting. Called between
  /// slices of a wait, from the waiting thread; must be cheap and must not block.
  using stop_check = std::function<std::optional<troupe::error>()>;

  /// Forwards to `base`; get() and wait() wait in slices of `slice` and ask `stop` between
  /// slices. The other calls are forwarded as they are (they do not wait for others).
  interruptible_store(std::shared_ptr<store> base, stop_check stop,
                      duration slice = std::chrono::milliseconds(100));

  using store::add;
  using store::get;
  using store::set;
  using store::wait;

  expected<void> set(std::string_view key, std::span<const std::byte> value,
                     duration timeout) override;
  expected<bytes> get(std::string_view key, duration timeout) override;
  expected<bool> check(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> add(std::string_view key, std::int64_t delta, duration timeout) override;
  expected<bytes> compare_set(std::string_view key, const std::optional<bytes>& expected_value,
                              std::span<const std::byte> desired, duration timeout) override;
  expected<bool> erase(std::string_view key, duration timeout) override;
  expected<void> wait(std::span<const std::string> keys, duration timeout) override;
  expected<std::int64_t> num_keys(duration timeout) override;
  std::string describe() const override;

 private:
  // Runs `call(slice)` until it succeeds, fails with anything but timeout, `stop` says
  // so, or `timeout` passes; `what` names the keys for the final timeout's message.
  template <class R, class Call>
  expected<R> sliced(duration timeout, const std::string& what, Call&& call);

  std::shared_ptr<store> base_;
  stop_check stop_;
  duration slice_;
};

}  // namespace troupe::collectives
