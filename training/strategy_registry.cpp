#include <troupe/training/strategy_registry.hpp>

#include <algorithm>
#include <mutex>

namespace troupe::training {

std::string_view to_string(start_method m) noexcept {
  switch (m) {
    case start_method::exec:
      return "exec";
    case start_method::spawn:
      return "spawn";
    case start_method::fork:
      return "fork";
  }
  return "?";
}

expected<start_method> parse_start_method(std::string_view text) {
  if (text == "exec" || text == "popen") return start_method::exec;
  if (text == "spawn") return start_method::spawn;
  if (text == "fork") return start_method::fork;
  return make_error(errc::invalid_argument, "unknown start method '", text,
                    "'; use exec, spawn or fork");
}

strategy_registry strategy_registry::with_builtins() {
  strategy_registry r;
  const std::pair<const char*, start_method> bases[] = {{"ddp", start_method::exec},
                                                        {"ddp_spawn", start_method::spawn},
                                                        {"ddp_fork", start_method::fork},
                                                        {"ddp_notebook", start_method::fork}};
  for (auto [base, method] : bases) {
    (void)r.add({base, "ddp", method, std::nullopt,
                 strcat("DDP strategy with start method '", to_string(method), "'")});
    for (bool fup : {false, true})
      (void)r.add({strcat(base, "_find_unused_parameters_", fup ? "true" : "false"), "ddp", method,
                   fup,
                   strcat("DDP strategy with find_unused_parameters ", fup ? "true" : "false",
                          " and start method '", to_string(method), "'")});
  }
  return r;
}

namespace {
std::mutex global_mu;
}

strategy_registry& strategy_registry::global() {
  static strategy_registry r = with_builtins();
  return r;
}

expected<void> strategy_registry::add(strategy_info info) {
  if (info.name.empty()) return make_error(errc::invalid_argument, "a strategy needs a name");
  std::lock_guard lk(global_mu);
  for (auto& e : entries_)
    if (e.name == info.name)
      return make_error(errc::already_exists, "a strategy named '", info.name,
                        "' is registered already (", e.description, ")");
  entries_.push_back(std::move(info));
  return ok();
}

expected<strategy_info> strategy_registry::find(std::string_view name) const {
  std::lock_guard lk(global_mu);
  for (auto& e : entries_)
    if (e.name == name) return e;
  std::vector<std::string> known;
  for (auto& e : entries_) known.push_back(e.name);
  std::sort(known.begin(), known.end());
  std::string list;
  for (auto& k : known) list += (list.empty() ? "" : ", ") + k;
  return make_error(errc::not_found, "no training strategy named '", name,
                    "'; the registered ones are: ", list);
}

std::vector<std::string> strategy_registry::names() const {
  std::lock_guard lk(global_mu);
  std::vector<std::string> out;
  for (auto& e : entries_) out.push_back(e.name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace troupe::training
