#include <doctest/doctest.h>

#include <string>

#include <troupe/core/json.hpp>

using troupe::append_json_string;

TEST_CASE("a JSON string escapes quotes, backslashes and control characters and keeps the rest") {
  std::string out = "x=";
  append_json_string(out, "plain");
  CHECK(out == "x=\"plain\"");
  out.clear();
  append_json_string(out, "a\"b\\c\nd\te\rf");
  CHECK(out == R"("a\"b\\c\nd\te\rf")");
  out.clear();
  append_json_string(out, std::string_view("\x01\x1f", 2));
  CHECK(out == R"("\u0001\u001f")");
  out.clear();
  append_json_string(out, "caf\xc3\xa9");  // UTF-8 passes through
  CHECK(out == "\"caf\xc3\xa9\"");
  out.clear();
  append_json_string(out, "");
  CHECK(out == "\"\"");
}
