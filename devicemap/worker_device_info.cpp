#include <troupe/devicemap/worker_device_info.hpp>

#include <cstdint>

#include <troupe/core/strcat.hpp>

namespace troupe {
namespace {

constexpr std::uint8_t record_version = 1;
// The smallest encodings, used to refuse counts that cannot fit in the remaining input
// before reserving anything.
constexpr std::size_t min_device_bytes = 1;
constexpr std::size_t min_target_bytes = 4 + 4;

void put_device(byte_writer& w, device d) {
  w.u8(static_cast<std::uint8_t>(d.type()));
  if (d.is_cuda()) w.i32(d.index());
}

expected<device> get_device(byte_reader& r, const std::string& what) {
  auto type = r.u8(what);
  if (!type) return std::move(type).error();
  if (*type == static_cast<std::uint8_t>(device_type::cpu)) return device::cpu();
  if (*type != static_cast<std::uint8_t>(device_type::cuda))
    return make_error(errc::protocol_error, "unknown device type ", int(*type), " in ", what,
                      "; expected 0 (cpu) or 1 (cuda)");
  auto index = r.i32(what);
  if (!index) return std::move(index).error();
  if (*index < 0)
    return make_error(errc::protocol_error, "negative CUDA index ", *index, " in ", what);
  return device::cuda(*index);
}

expected<std::uint32_t> get_count(byte_reader& r, const std::string& what,
                                  std::size_t min_item_bytes) {
  auto n = r.u32(what);
  if (!n) return std::move(n).error();
  if (static_cast<std::size_t>(*n) > r.remaining() / min_item_bytes)
    return make_error(errc::protocol_error, what, " is ", *n, " but only ", r.remaining(),
                      " bytes remain; the record is truncated or corrupt");
  return *n;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const worker_device_info& info) {
  return os << "worker '" << info.name << "' (device count " << info.device_count << ", devices "
            << to_string(info.devices) << ", maps " << to_string(info.maps) << ')';
}

void encode(const worker_device_info& info, bytes& out) {
  byte_writer w(out);
  w.u8(record_version);
  w.str(info.name);
  w.i32(info.device_count);
  w.u32(static_cast<std::uint32_t>(info.maps.size()));
  for (const auto& [target, m] : info.maps) {
    w.str(target);
    w.u32(static_cast<std::uint32_t>(m.size()));
    for (const auto& [source, dest] : m) {
      put_device(w, source);
      put_device(w, dest);
    }
  }
  w.u32(static_cast<std::uint32_t>(info.devices.size()));
  for (device d : info.devices) put_device(w, d);
}

bytes encode(const worker_device_info& info) {
  bytes out;
  encode(info, out);
  return out;
}

expected<worker_device_info> decode_worker_device_info(std::span<const std::byte> data) {
  byte_reader r(data);
  auto version = r.u8("device record version");
  if (!version) return std::move(version).error();
  if (*version != record_version)
    return make_error(errc::protocol_error, "device record version is ", int(*version),
                      "; this build reads version ", int(record_version),
                      "; run the same troupe version on every worker");

  worker_device_info info;
  auto name = r.str("device record worker name");
  if (!name) return std::move(name).error();
  info.name = std::move(*name);
  const std::string who = strcat("device record of '", info.name, "'");

  auto count = r.i32(who + ": device count");
  if (!count) return std::move(count).error();
  if (*count < 0)
    return make_error(errc::protocol_error, who, ": device count is ", *count,
                      "; it must not be negative");
  info.device_count = *count;

  auto targets = get_count(r, who + ": number of device map targets", min_target_bytes);
  if (!targets) return std::move(targets).error();
  for (std::uint32_t t = 0; t < *targets; ++t) {
    auto target = r.str(who + ": device map target name");
    if (!target) return std::move(target).error();
    if (info.maps.contains(*target))
      return make_error(errc::protocol_error, who, ": device map target '", *target,
                        "' appears twice");
    const std::string where = strcat(who, ": device map for '", *target, "'");
    auto entries = get_count(r, where + ": number of entries", 2 * min_device_bytes);
    if (!entries) return std::move(entries).error();
    device_map m;
    for (std::uint32_t e = 0; e < *entries; ++e) {
      auto source = get_device(r, where + ": source device");
      if (!source) return std::move(source).error();
      auto dest = get_device(r, where + ": target device");
      if (!dest) return std::move(dest).error();
      if (auto set = m.set(*source, *dest); !set)
        return make_error(errc::protocol_error, where, ": ", set.error().message());
    }
    info.maps.emplace(std::move(*target), std::move(m));
  }

  auto listed = get_count(r, who + ": number of listed devices", min_device_bytes);
  if (!listed) return std::move(listed).error();
  info.devices.reserve(*listed);
  for (std::uint32_t i = 0; i < *listed; ++i) {
    auto d = get_device(r, who + ": listed device");
    if (!d) return std::move(d).error();
    info.devices.push_back(*d);
  }

  if (!r.at_end())
    return make_error(errc::protocol_error, who, ": ", r.remaining(),
                      " unexpected bytes after the end of the record");
  return info;
}

}  // namespace troupe
