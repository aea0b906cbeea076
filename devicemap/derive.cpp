#include <troupe/devicemap/derive.hpp>

#include <algorithm>
#include <set>
#include <string>

namespace troupe {

device_maps reverse_device_maps(std::string_view my_name, std::span<const worker_device_info> all) {
  device_maps reverse;
  for (const auto& w : all) {
    auto it = w.maps.find(std::string(my_name));
    if (it != w.maps.end()) reverse.insert_or_assign(w.name, invert(it->second));
  }
  return reverse;
}

std::vector<device> build_device_list(const worker_device_info& me, const device_maps& reverse) {
  if (!me.devices.empty()) {
    std::vector<device> out = me.devices;
    std::sort(out.begin(), out.end());
    return out;
  }
  std::set<device> mine;
  for (const auto& [target, m] : me.maps)
    for (const auto& [source, dest] : m) mine.insert(source);
  for (const auto& [peer, m] : reverse)
    for (const auto& [source, dest] : m) mine.insert(source);
  mine.erase(device::cpu());
  return std::vector<device>(mine.begin(), mine.end());
}

expected<device_setup> resolve_device_setup(std::string_view my_name,
                                            std::span<const worker_device_info> all,
                                            group_kind kind) {
  TROUPE_TRY(validate_device_maps(all, kind));
  auto me = std::find_if(all.begin(), all.end(),
                         [&](const worker_device_info& w) { return w.name == my_name; });
  if (me == all.end()) {
    error e = make_error(errc::not_found, "worker '", my_name, "' has no device record among the ",
                         all.size(), " exchanged; publish this worker's record before resolving");
    e.with_worker(std::string(my_name)).with_operation("resolve_device_setup");
    return e;
  }
  device_setup setup;
  setup.reverse_maps = reverse_device_maps(my_name, all);
  setup.devices = build_device_list(*me, setup.reverse_maps);
  return setup;
}

}  // namespace troupe
