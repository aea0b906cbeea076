#include <troupe/rpc/function_table.hpp>

#include <mutex>

namespace troupe::rpc {

expected<void> function_table::add_raw(std::string name, handler h, function_options options) {
  if (name.empty()) return make_error(errc::invalid_argument, "a function needs a non-empty name");
  if (name.rfind("troupe.", 0) == 0)
    return make_error(errc::invalid_argument, "function name '", name,
                      "' is reserved: names starting with 'troupe.' belong to the agent");
  std::unique_lock lk(mu_);
  if (entries_.contains(name))
    return make_error(errc::already_exists, "a function called '", name,
                      "' is already registered; choose another name");
  auto e = std::make_shared<entry>(entry{name, std::move(h), options});
  entries_.emplace(std::move(name), std::move(e));
  return ok();
}

std::shared_ptr<const function_table::entry> function_table::find(std::string_view name) const {
  std::shared_lock lk(mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::string> function_table::names() const {
  std::shared_lock lk(mu_);
  std::vector<std::string> out;
  for (const auto& [n, e] : entries_) out.push_back(n);
  return out;
}

}  // namespace troupe::rpc
