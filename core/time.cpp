#include <troupe/core/time.hpp>

#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <troupe/core/log.hpp>
#include <troupe/core/settings.hpp>

namespace troupe {

expected<duration> parse_duration(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "invalid duration '", text, "': ", why,
                      "; write a number with a unit, e.g. 500ms, 30s, 5m or 1h, or plain "
                      "seconds such as 0.1 or 30");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return bad("it is empty");
  if (s.front() == '-') return bad("it must not be negative");
  long long n = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, n);
  if (ec == std::errc::result_out_of_range) return bad("the number is too large");
  if (ec != std::errc() && s.front() != '.') return bad("it does not start with a number");
  if (ec != std::errc()) ptr = s.data();  // ".5": no whole part
  // An optional decimal fraction, as torchrun's float seconds ("0.1") need.
  long long frac = 0;
  long long frac_scale = 1;
  if (ptr != end && *ptr == '.') {
    ++ptr;
    const char* digits = ptr;
    while (ptr != end && std::isdigit(static_cast<unsigned char>(*ptr))) {
      if (frac_scale < 1'000'000'000LL) {
        frac = frac * 10 + (*ptr - '0');
        frac_scale *= 10;
      }
      ++ptr;
    }
    if (ptr == digits) return bad("a decimal point must be followed by digits");
  }
  std::string_view unit(ptr, static_cast<std::size_t>(end - ptr));
  long long factor_ms = 0;
  if (unit.empty() || unit == "s")
    factor_ms = 1000;
  else if (unit == "ms")
    factor_ms = 1;
  else if (unit == "m" || unit == "min")
    factor_ms = 60'000;
  else if (unit == "h")
    factor_ms = 3'600'000;
  else
    return bad("unknown unit (use ms, s, m or h)");
  if (n > (1LL << 50) / factor_ms) return bad("the number is too large");
  // The fraction, rounded to the nearest millisecond (frac < frac_scale <= 1e9, so the
  // product stays below 2^63 for factor_ms <= 3.6e6).
  const long long frac_ms = (frac * factor_ms + frac_scale / 2) / frac_scale;
  return duration(n * factor_ms + frac_ms);
}

std::string format_duration(duration d) {
  auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

namespace {

constexpr duration builtin_default_timeout = std::chrono::minutes(5);

duration timeout_from_environment() {
  const auto env = settings::default_timeout.value();
  if (!env) return builtin_default_timeout;
  auto parsed = parse_duration(*env);
  if (!parsed || parsed->count() == 0) {
    TROUPE_LOG(log_level::warn, "core", "ignoring ", settings::default_timeout.variable, "='", *env,
               "': ", parsed ? std::string("it must be positive") : parsed.error().message(),
               "; using ", format_duration(builtin_default_timeout));
    return builtin_default_timeout;
  }
  return *parsed;
}

std::atomic<std::int64_t>& default_timeout_ms() {
  static std::atomic<std::int64_t> value{timeout_from_environment().count()};
  return value;
}

}  // namespace

duration default_timeout() {
  return duration(default_timeout_ms().load(std::memory_order_relaxed));
}

expected<void> set_default_timeout(duration d) {
  if (d.count() <= 0)
    return make_error(errc::invalid_argument, "default timeout must be positive, got ",
                      format_duration(d));
  default_timeout_ms().store(d.count(), std::memory_order_relaxed);
  return ok();
}

deadline deadline::after(duration d) {
  auto now = clock::now();
  if (d >= std::chrono::duration_cast<duration>(clock::time_point::max() - now)) return never();
  return deadline(now + d);
}

duration deadline::remaining() const noexcept {
  auto now = clock::now();
  if (now >= at_) return duration::zero();
  if (at_ == clock::time_point::max()) return duration::max();
  // Round up so that a caller waiting `remaining()` does not wake just before the deadline.
  return std::chrono::ceil<duration>(at_ - now);
}

}  // namespace troupe
