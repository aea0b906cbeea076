#include <troupe/core/error.hpp>

#include <array>
#include <utility>

namespace troupe {

namespace {

constexpr std::array<std::pair<errc, std::string_view>, 16> names{{
    {errc::timeout, "timeout"},
    {errc::invalid_argument, "invalid_argument"},
    {errc::not_found, "not_found"},
    {errc::already_exists, "already_exists"},
    {errc::connection_lost, "connection_lost"},
    {errc::peer_left, "peer_left"},
    {errc::aborted, "aborted"},
    {errc::protocol_error, "protocol_error"},
    {errc::unauthorized, "unauthorized"},
    {errc::unavailable, "unavailable"},
    {errc::broken_promise, "broken_promise"},
    {errc::shut_down, "shut_down"},
    {errc::unsupported, "unsupported"},
    {errc::user_error, "user_error"},
    {errc::internal, "internal"},
    {errc::membership_changed, "membership_changed"},
}};

}  // namespace

std::string_view to_string(errc code) noexcept {
  for (const auto& [c, name] : names)
    if (c == code) return name;
  return "unknown_error";
}

bool from_string(std::string_view name, errc& out) noexcept {
  for (const auto& [c, n] : names) {
    if (n == name) {
      out = c;
      return true;
    }
  }
  return false;
}

const std::string& error::none() noexcept {
  static const std::string empty;
  return empty;
}

std::string error::to_string() const {
  std::string out(troupe::to_string(code()));
  if (!operation().empty()) out += " in " + operation();
  if (!worker().empty()) out += " on worker '" + worker() + "'";
  out += ": ";
  out += message();
  return out;
}

std::ostream& operator<<(std::ostream& os, const error& e) { return os << e.to_string(); }

std::ostream& operator<<(std::ostream& os, errc code) { return os << to_string(code); }

}  // namespace troupe
