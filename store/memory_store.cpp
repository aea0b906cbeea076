#include <troupe/store/memory_store.hpp>

#include <condition_variable>
#include <map>
#include <mutex>

#include <troupe/store/detail/kv_table.hpp>

namespace troupe {

struct memory_store::state {
  std::string name;
  std::mutex mu;
  std::condition_variable changed;
  detail::kv_table table;
};

memory_store::memory_store() : state_(std::make_shared<state>()) {}
memory_store::memory_store(std::shared_ptr<state> s) : state_(std::move(s)) {}
memory_store::~memory_store() = default;

std::unique_ptr<memory_store> memory_store::another_handle() const {
  return std::unique_ptr<memory_store>(new memory_store(state_));
}

std::unique_ptr<memory_store> memory_store::named(std::string_view name) {
  static std::mutex registry_mu;
  static std::map<std::string, std::weak_ptr<state>, std::less<>> registry;
  std::lock_guard lk(registry_mu);
  auto it = registry.find(name);
  std::shared_ptr<state> s = it == registry.end() ? nullptr : it->second.lock();
  if (!s) {
    s = std::make_shared<state>();
    s->name = std::string(name);
    registry.insert_or_assign(std::string(name), s);
  }
  return std::unique_ptr<memory_store>(new memory_store(std::move(s)));
}

std::string memory_store::describe() const {
  return state_->name.empty() ? "memory_store" : "memory_store '" + state_->name + "'";
}

expected<void> memory_store::set(std::string_view key, std::span<const std::byte> value, duration) {
  TROUPE_TRY(detail::check_key(key));
  {
    std::lock_guard lk(state_->mu);
    state_->table.set(key, value);
  }
  state_->changed.notify_all();
  return ok();
}

expected<bytes> memory_store::get(std::string_view key, duration timeout) {
  TROUPE_TRY(detail::check_key(key));
  auto until = deadline::after(timeout);
  std::unique_lock lk(state_->mu);
  const bytes* v = nullptr;
  bool found = state_->changed.wait_until(lk, until.time_point(), [&] {
    v = state_->table.find(key);
    return v != nullptr;
  });
  if (!found) return detail::store_timeout(describe(), "get", strcat("key '", key, "'"), timeout);
  return *v;
}

expected<bool> memory_store::check(std::span<const std::string> keys, duration) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  std::lock_guard lk(state_->mu);
  return state_->table.missing(keys).empty();
}

expected<std::int64_t> memory_store::add(std::string_view key, std::int64_t delta, duration) {
  TROUPE_TRY(detail::check_key(key));
  expected<std::int64_t> r;
  {
    std::lock_guard lk(state_->mu);
    r = state_->table.add(key, delta);
  }
  state_->changed.notify_all();
  return r;
}

expected<bytes> memory_store::compare_set(std::string_view key,
                                          const std::optional<bytes>& expected_value,
                                          std::span<const std::byte> desired, duration) {
  TROUPE_TRY(detail::check_key(key));
  bytes r;
  {
    std::lock_guard lk(state_->mu);
    r = state_->table.compare_set(key, expected_value, desired);
  }
  state_->changed.notify_all();
  return r;
}

expected<bool> memory_store::erase(std::string_view key, duration) {
  TROUPE_TRY(detail::check_key(key));
  std::lock_guard lk(state_->mu);
  return state_->table.erase(key);
}

expected<void> memory_store::wait(std::span<const std::string> keys, duration timeout) {
  for (const auto& k : keys) TROUPE_TRY(detail::check_key(k));
  auto until = deadline::after(timeout);
  std::unique_lock lk(state_->mu);
  bool all = state_->changed.wait_until(lk, until.time_point(),
                                        [&] { return state_->table.missing(keys).empty(); });
  if (!all) {
    auto missing = state_->table.missing(keys);
    return detail::store_timeout(describe(), "wait", "keys " + detail::quote_keys(missing),
                                 timeout);
  }
  return ok();
}

expected<std::int64_t> memory_store::num_keys(duration) {
  std::lock_guard lk(state_->mu);
  return state_->table.size();
}

expected<std::int64_t> memory_store::num_keys_with_prefix(std::string_view prefix, duration) {
  std::lock_guard lk(state_->mu);
  return state_->table.count_prefix(prefix);
}

}  // namespace troupe
