#include <doctest/doctest.h>

#include <troupe/core/codec.hpp>

using namespace troupe;

TEST_CASE("values written are read back in order") {
  bytes buf;
  byte_writer w(buf);
  w.u8(7);
  w.u32(0xdeadbeef);
  w.i64(-5);
  w.str("hello");
  w.blob(to_bytes("xyz"));
  byte_reader r(buf);
  CHECK(*r.u8("a") == 7);
  CHECK(*r.u32("b") == 0xdeadbeef);
  CHECK(*r.i64("c") == -5);
  CHECK(*r.str("d") == "hello");
  CHECK(to_string(*r.blob("e")) == "xyz");
  CHECK(r.at_end());
}

TEST_CASE("truncated input is a protocol error that names the field") {
  bytes buf;
  byte_writer w(buf);
  w.str("hello");
  buf.resize(buf.size() - 2);
  byte_reader r(buf);
  auto s = r.str("worker name");
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::protocol_error);
  CHECK(s.error().message().find("worker name") != std::string::npos);
}

TEST_CASE("a length over the limit is refused before any allocation") {
  bytes buf;
  byte_writer w(buf);
  w.u32(1u << 31);
  byte_reader r(buf);
  auto s = r.str("key", 1024);
  REQUIRE_FALSE(s);
  CHECK(s.error().message().find("limit is 1024") != std::string::npos);
}
