#include <doctest/doctest.h>

#include <mutex>
#include <vector>

#include <troupe/core/log.hpp>

using namespace troupe;

namespace {
struct capture {
  std::mutex mu;
  std::vector<std::string> lines;
  capture() {
    set_log_sink([this](std::string_view l) {
      std::lock_guard<std::mutex> lk(mu);
      lines.emplace_back(l);
    });
  }
  ~capture() { set_log_sink(nullptr); }
};
}  // namespace

TEST_CASE("log lines carry level, identity and component, and respect the threshold") {
  capture cap;
  auto old_level = current_log_level();
  auto old_identity = log_identity();
  set_log_level(log_level::info);
  set_log_identity("rank 3");
  TROUPE_LOG(log_level::debug, "store", "hidden");
  TROUPE_LOG(log_level::warn, "store", "key ", "k", " is slow");
  set_log_level(old_level);
  set_log_identity(old_identity);
  REQUIRE(cap.lines.size() == 1);
  const auto& line = cap.lines[0];
  CHECK(line.starts_with("[troupe W "));
  CHECK(line.find("rank 3] store: key k is slow") != std::string::npos);
}

TEST_CASE("a disabled level does not evaluate its message") {
  auto old_level = current_log_level();
  set_log_level(log_level::error);
  int evaluated = 0;
  auto expensive = [&] {
    ++evaluated;
    return "x";
  };
  TROUPE_LOG(log_level::info, "test", expensive());
  set_log_level(old_level);
  CHECK(evaluated == 0);
}

TEST_CASE("log levels parse by name and unknown names list the valid ones") {
  CHECK(*parse_log_level("DEBUG") == log_level::debug);
  CHECK(*parse_log_level("warning") == log_level::warn);
  auto bad = parse_log_level("loud");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("trace, debug, info, warn, error, off") != std::string::npos);
}
