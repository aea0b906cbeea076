#include <troupe/core/device.hpp>

#include <charconv>

namespace troupe {

expected<device> device::cuda(int index) {
  if (index < 0)
    return make_error(errc::invalid_argument, "Device index must not be negative, got cuda:", index,
                      "; CUDA devices are numbered from 0");
  return device(device_type::cuda, index);
}

expected<device> device::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "invalid device '", text, "': ", why,
                      "; write \"cpu\", \"cuda:N\" or N with N >= 0");
  };
  if (text == "cpu") return device::cpu();
  std::string_view digits = text;
  if (digits.starts_with("cuda:")) {
    digits.remove_prefix(5);
  } else if (digits == "cuda") {
    return bad("a CUDA device needs an index");
  } else if (digits.empty() ||
             (digits.front() != '-' && (digits.front() < '0' || digits.front() > '9'))) {
    return bad("unknown device type");
  }
  if (digits.starts_with('-'))
    return make_error(errc::invalid_argument, "invalid device '", text,
                      "': Device index must not be negative; CUDA devices are numbered from 0");
  int index = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size())
    return bad("the index is not a whole number");
  return device::cuda(index);
}

std::string device::to_string() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index_);
}

std::ostream& operator<<(std::ostream& os, const device& d) { return os << d.to_string(); }

}  // namespace troupe
