#include <troupe/core/worker_info.hpp>

namespace troupe {

expected<void> validate_worker_name(std::string_view name) {
  constexpr std::size_t max_len = 128;
  if (name.empty())
    return make_error(errc::invalid_argument,
                      "worker name must not be empty; give each worker a "
                      "unique name such as \"trainer0\"");
  if (name.size() > max_len)
    return make_error(errc::invalid_argument, "worker name '", name.substr(0, 32), "...' is ",
                      name.size(), " characters long; the limit is ", max_len);
  for (char c : name) {
    bool fine = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || c == '.' || c == ':';
    if (!fine)
      return make_error(errc::invalid_argument, "worker name '", name, "' contains the character '",
                        c, "'; use only letters, digits, '_', '-', '.' and ':'");
  }
  return ok();
}

std::ostream& operator<<(std::ostream& os, const worker_info& w) {
  return os << w.name << " (id " << w.id << ")";
}

}  // namespace troupe
