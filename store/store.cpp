#include <troupe/store/store.hpp>

namespace troupe {

expected<std::string> store::get_string(std::string_view key, duration timeout) {
  auto v = get(key, timeout);
  if (!v) return std::move(v).error();
  return to_string(*v);
}

}  // namespace troupe
