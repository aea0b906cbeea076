#include <troupe/devicemap/validate.hpp>

#include <cstddef>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include <troupe/core/strcat.hpp>

namespace troupe {
namespace {

constexpr std::string_view operation = "validate_device_maps";

using record_index = std::map<std::string, const worker_device_info*, std::less<>>;

error refuse(const std::string& worker, std::string message) {
  error e(errc::invalid_argument, std::move(message));
  e.with_worker(worker).with_operation(std::string(operation));
  return e;
}

/// "device count 4, so the valid devices are cpu and cuda:0..cuda:3".
std::string valid_range(int count) {
  std::string text = strcat("device count ", count, ", so the valid devices are ");
  if (count <= 0) return text + "cpu only";
  if (count == 1) return text + "cpu and cuda:0";
  return text + strcat("cpu and cuda:0..cuda:", count - 1);
}

std::string entry(device source, device target) { return strcat(source, " -> ", target); }

std::string group_names(std::span<const worker_device_info> all) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < all.size(); ++i) os << (i ? ", " : "") << all[i].name;
  os << ']';
  return std::move(os).str();
}

bool listed(const std::vector<device>& devices, device d) {
  for (device x : devices)
    if (x == d) return true;
  return false;
}

expected<void> check_records(std::span<const worker_device_info> all) {
  std::map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto& w = all[i];
    auto [it, inserted] = seen.emplace(w.name, i);
    if (!inserted)
      return refuse(w.name,
                    strcat("worker name '", w.name, "' appears twice in the group ", "(records ",
                           it->second, " and ", i, "); give every worker a unique name"));
    if (w.device_count < 0)
      return refuse(w.name, strcat("worker '", w.name, "' reports device count ", w.device_count,
                                   "; a device count must be 0 or more"));
  }
  return ok();
}

expected<void> check_device_list(const worker_device_info& w) {
  std::set<device> seen;
  for (device d : w.devices)
    if (!seen.insert(d).second)
      return refuse(w.name, strcat("worker '", w.name, "' lists ", d, " twice in its device list ",
                                   to_string(w.devices), "; list each device once"));
  for (device d : w.devices)
    if (!is_valid_device(d, w.device_count))
      return refuse(
          w.name,
          strcat("worker '", w.name, "' lists ", d, " in its device list ", to_string(w.devices),
                 ", but it has ", valid_range(w.device_count), "; remove ", d,
                 " from the list or run '", w.name, "' where that GPU is visible"));
  return ok();
}

expected<void> check_target_names(const worker_device_info& w, const record_index& index,
                                  std::span<const worker_device_info> all) {
  for (const auto& [target, m] : w.maps)
    if (!index.contains(target))
      return refuse(w.name, strcat("worker '", w.name, "' has a device map for worker '", target,
                                   "' ", m, ", but no worker of that name is in the ", "group ",
                                   group_names(all), "; correct the target name or ",
                                   "remove that map (a static group gains no workers later)"));
  return ok();
}

expected<void> check_map(const worker_device_info& w, const std::string& target,
                         const device_map& m, const worker_device_info* peer) {
  const std::string where = strcat("worker '", w.name, "' maps ");
  const std::string map_for = strcat(" in its device map for worker '", target, "'");

  // No two sources share a target device.
  std::map<device, device> first_source_of;
  for (const auto& [source, dest] : m) {
    auto [it, inserted] = first_source_of.emplace(dest, source);
    if (!inserted)
      return refuse(w.name, strcat(where, "both ", entry(it->second, dest), " and ",
                                   entry(source, dest), map_for, " ", m, "; each device of '",
                                   target, "' may receive from one device of '", w.name,
                                   "' only; give ", source, " another target or drop it"));
  }

  // Sources exist on this worker.
  for (const auto& [source, dest] : m) {
    if (source.is_cpu()) continue;  // cpu exists everywhere and is never listed
    if (!w.devices.empty()) {
      if (!listed(w.devices, source))
        return refuse(w.name,
                      strcat(where, entry(source, dest), map_for, ", but ", source,
                             " is not in the device list of '", w.name, "' ", to_string(w.devices),
                             "; add ", source, " to that list or drop the entry"));
    } else if (!is_valid_device(source, w.device_count)) {
      return refuse(w.name, strcat(where, entry(source, dest), map_for, ", but '", w.name, "' has ",
                                   valid_range(w.device_count),
                                   "; use a source device that exists on '", w.name, "'"));
    }
  }

  // Targets exist on the target worker, when we know it.
  if (peer == nullptr) return ok();
  for (const auto& [source, dest] : m) {
    if (dest.is_cpu()) continue;
    if (!peer->devices.empty()) {
      if (!listed(peer->devices, dest))
        return refuse(w.name, strcat(where, entry(source, dest), map_for, ", but ", dest,
                                     " is not in the device list of '", target, "' ",
                                     to_string(peer->devices), "; map to a device that '", target,
                                     "' lists or add ", dest, " to its list"));
    } else if (!is_valid_device(dest, peer->device_count)) {
      return refuse(w.name, strcat(where, entry(source, dest), map_for, ", but '", target, "' has ",
                                   valid_range(peer->device_count),
                                   "; map to a device that exists on '", target, "'"));
    }
  }
  return ok();
}

}  // namespace

bool is_valid_device(device d, int device_count) noexcept {
  return d.is_cpu() || (d.is_cuda() && d.index() >= 0 && d.index() < device_count);
}

expected<void> validate_device_maps(std::span<const worker_device_info> all, group_kind kind) {
  TROUPE_TRY(check_records(all));

  record_index index;
  for (const auto& w : all) index.emplace(w.name, &w);

  for (const auto& w : all) TROUPE_TRY(check_device_list(w));

  for (const auto& w : all) {
    if (kind == group_kind::static_group) TROUPE_TRY(check_target_names(w, index, all));
    for (const auto& [target, m] : w.maps) {
      auto it = index.find(target);
      const worker_device_info* peer = it == index.end() ? nullptr : it->second;
      TROUPE_TRY(check_map(w, target, m, peer));
    }
  }
  return ok();
}

}  // namespace troupe
