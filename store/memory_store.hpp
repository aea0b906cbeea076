// memory_store: an in-process store for unit tests and single-process runs. Waiters block
// on a condition variable; every method is thread-safe.
#pragma once

#include <memory>
#include <string>

#include <troupe/store/prefix_count.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

class memory_store final : public store, public prefix_countable {
 public:
  /// A fresh, empty store.
  memory_store();
  ~memory_store() override;

  /// Another handle onto the same keys (for handing one store to several owners).
  std::unique_ptr<memory_store> another_handle() const;

  /// A handle onto the process-wide store called `name`, created empty on first use and
  /// kept while any handle to it lives (what "memory://name" opens).
  static std::unique_ptr<memory_store> named(std::string_view name);

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
  expected<std::int64_t> num_keys_with_prefix(std::string_view prefix, duration timeout) override;
  std::string describe() const override;

 private:
  struct state;
  explicit memory_store(std::shared_ptr<state> s);
  std::shared_ptr<state> state_;
};

}  // namespace troupe
