// key_ledger: a decorator that remembers every key written through it (set, add,
// compare_set), so that whoever wrote a set of keys can take them out again once nobody
// needs them: the elastic group erases each epoch's build keys when a later epoch's group
// is built (docs/membership.md, "Keys an epoch leaves behind"). Reads, waits and erases
// pass through unrecorded.
//
// Thread-safe. The ledger forgets a key once erase_written() (or an erase() through it)
// removed it.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <troupe/store/store.hpp>

namespace troupe {

class key_ledger final : public store {
 public:
  /// Shares ownership of `base`.
  explicit key_ledger(std::shared_ptr<store> base);

  /// The keys written through this store and not erased since, in key order.
  std::vector<std::string> written() const;
  /// Erases every key written through this store, each bounded by `timeout`; returns how
  /// many existed. Keys whose erase fails stay in the ledger, and the first error is
  /// returned after the others were tried.
  expected<std::size_t> erase_written(duration timeout);

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
  void note(std::string_view key);

  std::shared_ptr<store> base_;
  mutable std::mutex mu_;
  std::set<std::string, std::less<>> written_;
};

}  // namespace troupe
