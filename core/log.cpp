#include <troupe/core/log.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>

#include <troupe/core/settings.hpp>

namespace troupe {

namespace {

constexpr std::string_view level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

struct log_config {
  std::atomic<int> level{static_cast<int>(log_level::warn)};
  std::mutex mu;  // guards identity and sink (copied out before use)
  std::string identity;
  std::shared_ptr<std::function<void(std::string_view)>> sink;
  std::string bad_env;  // a TROUPE_LOG_LEVEL we could not read, reported once

  log_config() {
    if (const char* rank = std::getenv("RANK"); rank != nullptr && *rank != '\0')
      identity = std::string("rank ") + rank;
    if (const auto env = settings::logging_level.value()) {
      if (auto lvl = parse_log_level(*env))
        level = static_cast<int>(*lvl);
      else
        bad_env = lvl.error().message();
    }
  }
};

log_config& config() {
  static log_config cfg;
  static std::once_flag reported;
  std::call_once(reported, [] {
    if (!cfg.bad_env.empty())
      log_write(log_level::warn, "log", "ignoring TROUPE_LOG_LEVEL: " + cfg.bad_env);
  });
  return cfg;
}

}  // namespace

expected<log_level> parse_log_level(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "warning") lower = "warn";
  for (std::size_t i = 0; i < std::size(level_names); ++i)
    if (level_names[i] == lower) return static_cast<log_level>(i);
  return make_error(errc::invalid_argument, "unknown log level '", name,
                    "'; use one of trace, debug, info, warn, error, off");
}

std::string_view to_string(log_level level) noexcept {
  auto i = static_cast<std::size_t>(level);
  return i < std::size(level_names) ? level_names[i] : "unknown";
}

log_level current_log_level() noexcept {
  return static_cast<log_level>(config().level.load(std::memory_order_relaxed));
}

void set_log_level(log_level level) noexcept {
  config().level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void set_log_identity(std::string identity) {
  auto& cfg = config();
  std::lock_guard<std::mutex> lk(cfg.mu);
  cfg.identity = std::move(identity);
}

std::string log_identity() {
  auto& cfg = config();
  std::lock_guard<std::mutex> lk(cfg.mu);
  return cfg.identity;
}

void set_log_sink(std::function<void(std::string_view)> sink) {
  auto& cfg = config();
  std::lock_guard<std::mutex> lk(cfg.mu);
  cfg.sink =
      sink ? std::make_shared<std::function<void(std::string_view)>>(std::move(sink)) : nullptr;
}

void log_write(log_level level, std::string_view component, std::string_view message) {
  auto& cfg = config();
  std::string identity;
  std::shared_ptr<std::function<void(std::string_view)>> sink;
  {
    std::lock_guard<std::mutex> lk(cfg.mu);
    identity = cfg.identity;
    sink = cfg.sink;
  }
  using namespace std::chrono;
  auto now = system_clock::now();
  auto t = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms));
  static constexpr char letters[] = "TDIWEO";
  std::string line;
  line.reserve(48 + identity.size() + component.size() + message.size());
  line += "[troupe ";
  line += letters[static_cast<int>(level)];
  line += ' ';
  line += stamp;
  if (!identity.empty()) {
    line += ' ';
    line += identity;
  }
  line += "] ";
  line += component;
  line += ": ";
  line += message;
  if (sink) {
    (*sink)(line);
    return;
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one call: lines do not interleave
}

}  // namespace troupe
