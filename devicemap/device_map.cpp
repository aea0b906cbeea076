#include <troupe/devicemap/device_map.hpp>

#include <sstream>

namespace troupe {

expected<void> device_map::set(device source, device target) {
  auto [it, inserted] = entries_.try_emplace(source, target);
  if (!inserted && it->second != target)
    return make_error(errc::invalid_argument, "device map already sends ", source, " to ",
                      it->second, "; it cannot also send it to ", target,
                      " (a source device has one target); keep one of ", source, " -> ", it->second,
                      " and ", source, " -> ", target);
  return ok();
}

std::optional<device> device_map::find(device source) const {
  auto it = entries_.find(source);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

device_map invert(const device_map& m) {
  device_map out;
  // Sources come in ascending order, so on a shared target the first (smallest) wins and
  // later attempts are refused by set(); that refusal is the documented behaviour.
  for (const auto& [source, target] : m) (void)out.set(target, source);
  return out;
}

std::ostream& operator<<(std::ostream& os, const device_map& m) {
  os << '{';
  bool first = true;
  for (const auto& [source, target] : m) {
    if (!first) os << ", ";
    first = false;
    os << source << " -> " << target;
  }
  return os << '}';
}

std::string to_string(const device_map& m) {
  std::ostringstream os;
  os << m;
  return std::move(os).str();
}

std::string to_string(const device_maps& maps) {
  std::ostringstream os;
  os << '{';
  bool first = true;
  for (const auto& [name, m] : maps) {
    if (!first) os << ", ";
    first = false;
    os << name << ": " << m;
  }
  os << '}';
  return std::move(os).str();
}

std::string to_string(std::span<const device> devices) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (i != 0) os << ", ";
    os << devices[i];
  }
  os << ']';
  return std::move(os).str();
}

}  // namespace troupe
