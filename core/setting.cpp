#include <troupe/core/setting.hpp>

#include <cstdlib>

#include <troupe/core/settings.hpp>

namespace troupe {

std::optional<std::string> setting::value() const {
  for (std::string_view name : {variable, fallback}) {
    if (name.empty()) continue;
    const std::string key(name);
    if (const char* v = std::getenv(key.c_str()); v != nullptr && *v != '\0') return v;
  }
  return std::nullopt;
}

const std::string* setting::find_in(const std::map<std::string, std::string>& vars) const {
  for (std::string_view name : {variable, fallback}) {
    if (name.empty()) continue;
    auto it = vars.find(std::string(name));
    if (it != vars.end() && !it->second.empty()) return &it->second;
  }
  return nullptr;
}

std::string settings_markdown(std::span<const setting_list> lists) {
  std::string out = "| variable | default | meaning |\n|---|---|---|\n";
  for (const setting_list& list : lists)
    for (const setting* s : list) {
      out += "| `";
      out += s->variable;
      out += "` | ";
      out += s->default_value;
      out += " | ";
      out += s->doc;
      out += " |\n";
    }
  return out;
}

namespace settings {

setting_list core_settings() {
  static constexpr const setting* list[] = {
      &default_timeout, &logging_level, &error_file,   &local_addr,  &trace,
      &socket_ifname,   &store_url,     &store_prefix, &run_id,      &rendezvous_round,
      &restart_count,   &max_restarts,  &elastic,      &metrics_file};
  return list;
}

}  // namespace settings

}  // namespace troupe
