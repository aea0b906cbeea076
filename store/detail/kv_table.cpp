#include <troupe/store/detail/kv_table.hpp>

#include <algorithm>
#include <charconv>

#include <troupe/core/time.hpp>

namespace troupe::detail {

expected<void> check_key(std::string_view key) {
  if (key.empty())
    return make_error(errc::invalid_argument, "store keys must not be empty; name the key");
  return ok();
}

error store_timeout(std::string_view store_name, std::string_view operation, std::string_view what,
                    std::chrono::milliseconds waited) {
  return make_error(errc::timeout, operation, " on ", store_name, " timed out after ",
                    format_duration(waited), " waiting for ", what,
                    "; check that the process expected to write it is alive, or raise the "
                    "timeout")
      .with_operation(strcat("store.", operation));
}

std::string quote_keys(std::span<const std::string> keys, std::size_t limit) {
  std::string out;
  std::size_t shown = std::min(keys.size(), limit);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) out += (i + 1 == shown && shown == keys.size()) ? " and " : ", ";
    out += "'" + keys[i] + "'";
  }
  if (shown < keys.size()) out += strcat(" and ", keys.size() - shown, " more");
  return out;
}

void kv_table::set(std::string_view key, std::span<const std::byte> value) {
  auto it = map_.find(key);
  if (it == map_.end())
    map_.emplace(std::string(key), bytes(value.begin(), value.end()));
  else
    it->second.assign(value.begin(), value.end());
}

const bytes* kv_table::find(std::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

expected<std::int64_t> kv_table::add(std::string_view key, std::int64_t delta) {
  std::int64_t current = 0;
  if (const bytes* v = find(key)) {
    std::string text = to_string(*v);
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      if (text.size() > 32) text = text.substr(0, 32) + "...";
      return make_error(errc::invalid_argument, "add on key '", key, "': its value '", text,
                        "' is not a decimal integer; add() only works on keys that hold a "
                        "number (written by add() or set to one)");
    }
  }
  std::int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next))
    return make_error(errc::invalid_argument, "add on key '", key, "': ", current, " + ", delta,
                      " overflows a 64-bit integer");
  std::string text = std::to_string(next);
  set(key, std::as_bytes(std::span(text.data(), text.size())));
  return next;
}

bytes kv_table::compare_set(std::string_view key, const std::optional<bytes>& expected_value,
                            std::span<const std::byte> desired) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (expected_value) return {};
    map_.emplace(std::string(key), bytes(desired.begin(), desired.end()));
    return bytes(desired.begin(), desired.end());
  }
  if (expected_value && *expected_value == it->second)
    it->second.assign(desired.begin(), desired.end());
  return it->second;
}

bool kv_table::erase(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

std::int64_t kv_table::count_prefix(std::string_view prefix) const {
  std::int64_t n = 0;
  for (auto it = map_.lower_bound(prefix);
       it != map_.end() && std::string_view(it->first).starts_with(prefix); ++it)
    ++n;
  return n;
}

std::vector<std::string> kv_table::missing(std::span<const std::string> keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!contains(k)) out.push_back(k);
  return out;
}

}  // namespace troupe::detail
