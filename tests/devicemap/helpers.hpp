// Small builders shared by the devicemap suites.
#pragma once

#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <troupe/core/device.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/devicemap/device_map.hpp>
#include <troupe/devicemap/worker_device_info.hpp>

namespace troupe::test {

inline device cpu() { return device::cpu(); }
inline device cuda(int i) { return *device::cuda(i); }

/// A map built from pairs; the pairs must not give one source two targets.
inline device_map dmap(std::initializer_list<std::pair<device, device>> entries) {
  device_map m;
  for (const auto& [s, t] : entries) REQUIRE(m.set(s, t));
  return m;
}

inline worker_device_info worker(std::string name, int device_count, device_maps maps = {},
                                 std::vector<device> devices = {}) {
  return worker_device_info{std::move(name), device_count, std::move(maps), std::move(devices)};
}

/// Checks that `r` failed with `code` and that its message holds every part.
template <class T>
void check_refused(const expected<T>& r, std::initializer_list<std::string_view> parts,
                   errc code = errc::invalid_argument) {
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == code);
  const std::string& msg = r.error().message();
  for (std::string_view part : parts)
    CHECK_MESSAGE(msg.find(part) != std::string::npos, "'", part, "' not in: ", msg);
}

}  // namespace troupe::test

/// Failed checks on an `expected` print its error instead of "{?}".
template <class T>
struct doctest::StringMaker<troupe::expected<T>> {
  static doctest::String convert(const troupe::expected<T>& r) {
    return r.has_value() ? "ok" : r.error().to_string().c_str();
  }
};
