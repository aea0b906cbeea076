// Levelled logging to stderr. The level comes from TROUPE_LOG_LEVEL (trace, debug, info,
// warn, error, off; default warn). Each line carries the worker's identity when known:
// set_log_identity(), else "rank N" from RANK in the environment.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>
#include <troupe/core/strcat.hpp>

namespace troupe {

enum class log_level { trace = 0, debug, info, warn, error, off };

/// Parses a level name (case-insensitive); the error lists the valid names.
expected<log_level> parse_log_level(std::string_view name);
std::string_view to_string(log_level level) noexcept;

/// The current threshold; messages below it are dropped before they are formatted.
log_level current_log_level() noexcept;
void set_log_level(log_level level) noexcept;
inline bool log_enabled(log_level level) noexcept {
  return level >= current_log_level() && level != log_level::off;
}

/// Who this process is, e.g. "rank 3" or "trainer0"; shown on every line.
void set_log_identity(std::string identity);
std::string log_identity();

/// Replaces where finished lines go (default: stderr). Pass nullptr to restore stderr.
/// The sink is called without troupe locks held, possibly from several threads at once.
void set_log_sink(std::function<void(std::string_view line)> sink);

/// Writes one line: "[troupe W 12:00:01.234 rank 3] store: message".
void log_write(log_level level, std::string_view component, std::string_view message);

}  // namespace troupe

/// TROUPE_LOG(level, "component", parts...): formats only when the level is enabled.
#define TROUPE_LOG(level, component, ...)                                   \
  do {                                                                      \
    if (::troupe::log_enabled(level))                                       \
      ::troupe::log_write(level, component, ::troupe::strcat(__VA_ARGS__)); \
  } while (false)
