#include <doctest/doctest.h>

#include <sstream>

#include <troupe/core/codec.hpp>
#include <troupe/devicemap/worker_device_info.hpp>
#include "helpers.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

worker_device_info sample() {
  return worker("trainer-0", 4,
                {{"ps", dmap({{cpu(), cpu()}, {cuda(0), cuda(1)}, {cuda(3), cuda(2)}})},
                 {"trainer-1", device_map{}}},
                {cuda(3), cuda(0)});
}

}  // namespace

TEST_CASE("a device record survives encode and decode unchanged") {
  for (const auto& info : {sample(), worker("", 0), worker("w", 2, {}, {cpu(), cuda(1)})}) {
    auto decoded = decode_worker_device_info(encode(info));
    REQUIRE(decoded);
    CHECK(*decoded == info);
  }
}

TEST_CASE("encode appends to a buffer that already holds bytes") {
  bytes buf = to_bytes("xy");
  encode(sample(), buf);
  auto decoded = decode_worker_device_info(std::span<const std::byte>(buf).subspan(2));
  REQUIRE(decoded);
  CHECK(*decoded == sample());
}

TEST_CASE("every truncation of a device record is a protocol error") {
  const bytes full = encode(sample());
  for (std::size_t n = 0; n < full.size(); ++n) {
    auto r = decode_worker_device_info(std::span<const std::byte>(full).first(n));
    CAPTURE(n);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::protocol_error);
  }
  auto empty = decode_worker_device_info({});
  check_refused(empty, {"device record version"}, errc::protocol_error);
}

TEST_CASE("a truncated device record names the field being read") {
  bytes buf;
  byte_writer w(buf);
  w.u8(1);
  w.str("w0");
  w.u8(0);  // half of the device count
  check_refused(decode_worker_device_info(buf), {"'w0'", "device count"}, errc::protocol_error);
}

TEST_CASE("trailing bytes after a device record are refused") {
  bytes buf = encode(sample());
  buf.push_back(std::byte{0});
  check_refused(decode_worker_device_info(buf), {"unexpected bytes"}, errc::protocol_error);
}

TEST_CASE("an unknown record version is refused") {
  bytes buf = encode(sample());
  buf[0] = std::byte{9};
  check_refused(decode_worker_device_info(buf), {"version is 9"}, errc::protocol_error);
}

TEST_CASE("malformed fields inside a device record are refused") {
  auto header = [](bytes& buf, int count) {
    byte_writer w(buf);
    w.u8(1);
    w.str("w0");
    w.i32(count);
  };
  SUBCASE("negative device count") {
    bytes buf;
    header(buf, -1);
    check_refused(decode_worker_device_info(buf), {"device count is -1"}, errc::protocol_error);
  }
  SUBCASE("unknown device type") {
    bytes buf;
    header(buf, 1);
    byte_writer w(buf);
    w.u32(0);  // no maps
    w.u32(1);  // one listed device
    w.u8(7);
    check_refused(decode_worker_device_info(buf), {"device type 7", "listed device"},
                  errc::protocol_error);
  }
  SUBCASE("negative cuda index") {
    bytes buf;
    header(buf, 1);
    byte_writer w(buf);
    w.u32(0);
    w.u32(1);
    w.u8(1);
    w.i32(-3);
    check_refused(decode_worker_device_info(buf), {"negative CUDA index -3"}, errc::protocol_error);
  }
  SUBCASE("a target named twice") {
    bytes buf;
    header(buf, 1);
    byte_writer w(buf);
    w.u32(2);
    w.str("w1");
    w.u32(0);
    w.str("w1");
    w.u32(0);
    w.u32(0);
    check_refused(decode_worker_device_info(buf), {"'w1' appears twice"}, errc::protocol_error);
  }
  SUBCASE("a source mapped to two targets") {
    bytes buf;
    header(buf, 1);
    byte_writer w(buf);
    w.u32(1);
    w.str("w1");
    w.u32(2);
    w.u8(0);  // cpu -> cpu
    w.u8(0);
    w.u8(0);  // cpu -> cuda:0
    w.u8(1);
    w.i32(0);
    w.u32(0);
    check_refused(decode_worker_device_info(buf), {"device map for 'w1'", "cpu", "cuda:0"},
                  errc::protocol_error);
  }
  SUBCASE("a count larger than the remaining input") {
    bytes buf;
    header(buf, 1);
    byte_writer w(buf);
    w.u32(0);
    w.u32(0xffffffffu);
    check_refused(decode_worker_device_info(buf), {"number of listed devices"},
                  errc::protocol_error);
  }
}

TEST_CASE("a device record prints its name, count, devices and maps") {
  std::ostringstream os;
  os << worker("w0", 2, {{"w1", dmap({{cuda(0), cuda(1)}})}}, {cuda(0)});
  CHECK(os.str() ==
        "worker 'w0' (device count 2, devices [cuda:0], maps {w1: {cuda:0 -> cuda:1}})");
}
