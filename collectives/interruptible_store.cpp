#include <troupe/collectives/interruptible_store.hpp>

#include <algorithm>

namespace troupe::collectives {

interruptible_store::interruptible_store(std::shared_ptr<store> base, stop_check stop,
                                         duration slice)
    : base_(std::move(base)), stop_(std::move(stop)), slice_(slice) {
  set_timeout(base_->timeout());
}

template <class R, class Call>
expected<R> interruptible_store::sliced(duration timeout, const std::string& what, Call&& call) {
  const auto dl = deadline::after(timeout);
  for (;;) {
    if (auto why = stop_()) return *why;
    const auto left = dl.remaining();
    auto r = call(std::clamp(left, duration(1), slice_));
    if (r || r.error().code() != errc::timeout) return r;
    if (dl.expired())
      return make_error(errc::timeout, what, " did not appear in ", base_->describe(), " within ",
                        format_duration(timeout));
  }
}

expected<void> interruptible_store::set(std::string_view key, std::span<const std::byte> value,
                                        duration timeout) {
  return base_->set(key, value, timeout);
}

expected<bytes> interruptible_store::get(std::string_view key, duration timeout) {
  return sliced<bytes>(timeout, strcat("key '", key, "'"),
                       [&](duration d) { return base_->get(key, d); });
}

expected<bool> interruptible_store::check(std::span<const std::string> keys, duration timeout) {
  return base_->check(keys, timeout);
}

expected<std::int64_t> interruptible_store::add(std::string_view key, std::int64_t delta,
                                                duration timeout) {
  return base_->add(key, delta, timeout);
}

expected<bytes> interruptible_store::compare_set(std::string_view key,
                                                 const std::optional<bytes>& expected_value,
                                                 std::span<const std::byte> desired,
                                                 duration timeout) {
  return base_->compare_set(key, expected_value, desired, timeout);
}

expected<bool> interruptible_store::erase(std::string_view key, duration timeout) {
  return base_->erase(key, timeout);
}

expected<void> interruptible_store::wait(std::span<const std::string> keys, duration timeout) {
  std::string what = "keys";
  for (const auto& k : keys) what += strcat(" '", k, "'");
  return sliced<void>(timeout, what, [&](duration d) { return base_->wait(keys, d); });
}

expected<std::int64_t> interruptible_store::num_keys(duration timeout) {
  return base_->num_keys(timeout);
}

std::string interruptible_store::describe() const { return base_->describe(); }

}  // namespace troupe::collectives
