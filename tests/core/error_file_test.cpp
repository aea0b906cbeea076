#include <troupe/core/error_file.hpp>

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

using namespace troupe;
namespace fs = std::filesystem;

namespace {

fs::path fresh_file(const char* name) {
  auto p = fs::temp_directory_path() /
           (std::string("troupe-errfile-") + name + "-" + std::to_string(::getpid()) + ".json");
  fs::remove(p);
  return p;
}

}  // namespace

TEST_CASE("record_error writes torchrun's layout and read_error_file reads it back") {
  const auto file = fresh_file("roundtrip");
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  ::setenv("TROUPE_ERROR_FILE", file.c_str(), 1);
  CHECK(error_file_path() == file.string());
  const std::string message = "bad \"value\"\n\tat\\here \x01";
  REQUIRE(record_error(message));
  std::ifstream in(file);
  std::stringstream json;
  json << in.rdbuf();
  CHECK(json.str().rfind(
            "{\"message\": {\"message\": \"bad \\\"value\\\"\\n\\tat\\\\here \\u0001\"", 0) == 0);
  auto c = read_error_file(file.string());
  CHECK(c.message == message);
  CHECK(std::strtoll(c.timestamp.c_str(), nullptr, 10) > 1'600'000'000);
  CHECK_FALSE(c.stack.empty());
  // The first record is the root cause: a later one does not replace it.
  CHECK_FALSE(record_error(make_error(errc::timeout, "later")));
  CHECK(read_error_file(file.string()).message == message);
  ::unsetenv("TROUPE_ERROR_FILE");
  fs::remove(file);
}

TEST_CASE("TORCHELASTIC_ERROR_FILE is honoured when TROUPE_ERROR_FILE is unset") {
  const auto file = fresh_file("torchelastic");
  ::unsetenv("TROUPE_ERROR_FILE");
  ::setenv("TORCHELASTIC_ERROR_FILE", file.c_str(), 1);
  REQUIRE(record_error(make_error(errc::invalid_argument, "rank 3: shapes differ")));
  CHECK(read_error_file(file.string()).message.find("rank 3: shapes differ") != std::string::npos);
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  CHECK(error_file_path().empty());
  CHECK_FALSE(record_error("nowhere to go"));
  fs::remove(file);
}

TEST_CASE("run_main records an escaping exception and returns 1") {
  const auto file = fresh_file("run-main");
  ::setenv("TROUPE_ERROR_FILE", file.c_str(), 1);
  CHECK(run_main([] { return 0; }) == 0);
  CHECK_FALSE(fs::exists(file));
  CHECK(run_main([]() -> int { throw std::runtime_error("out of memory"); }) == 1);
  CHECK(read_error_file(file.string()).message == "uncaught exception: out of memory");
  ::unsetenv("TROUPE_ERROR_FILE");
  fs::remove(file);
}

TEST_CASE("an error file written by torchrun's @record is read") {
  const auto file = fresh_file("torchrun");
  std::ofstream(file) << R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
                      << R"({"py_callstack": "Traceback ...", "timestamp": "1700000000"}}})";
  auto c = read_error_file(file.string());
  CHECK(c.message == "RuntimeError: boom");
  CHECK(c.timestamp == "1700000000");
  CHECK(c.stack == "Traceback ...");
  CHECK(read_error_file((file.string() + ".missing")).message.empty());
  fs::remove(file);
}
