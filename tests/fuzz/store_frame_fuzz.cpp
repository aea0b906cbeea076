// Fuzz target over the store's frame decoders (store/detail/wire.hpp): the hello, the
// challenge and its answer, every
// request kind, and the status of a reply, as a server and a client read them.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <troupe/store/detail/wire.hpp>
#include "fuzz/fuzz_seeds.hpp"

namespace wire = troupe::detail::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto body = std::span(reinterpret_cast<const std::byte*>(data), size);
  (void)wire::peek(body);
  (void)wire::decode_hello(body);
  (void)wire::decode_challenge(body);
  (void)wire::decode_auth(body);
  (void)wire::decode_request(body);
  if (size >= wire::min_body) {
    troupe::byte_reader r(body.subspan(wire::min_body));
    (void)wire::decode_reply_status(r);
  }
  return 0;
}

namespace troupe::fuzz {

std::vector<std::vector<std::uint8_t>> seeds() {
  std::vector<std::vector<std::uint8_t>> out;
  auto add = [&](const troupe::bytes& framed) {
    // The decoders take a body: drop the length prefix.
    auto* p = reinterpret_cast<const std::uint8_t*>(framed.data());
    out.emplace_back(p + wire::length_size, p + framed.size());
  };
  add(wire::encode_hello({wire::magic, wire::version, "secret", "client"}));
  add(wire::encode_hello_ok("server"));
  add(wire::encode_challenge({std::string(16, 'n'), std::string(32, 'p')}));
  add(wire::encode_auth({true, std::string(32, 'p')}));
  // Each request kind with a key and a short value: mutations find the other layouts.
  for (int k = static_cast<int>(wire::kind::set); k <= static_cast<int>(wire::kind::set_quiet);
       ++k) {
    wire::frame_builder fb(static_cast<wire::kind>(k), 1);
    fb.writer().str("some/key");
    fb.writer().str("value");
    add(std::move(fb).finish());
  }
  add(wire::encode_reply_error(7, troupe::make_error(troupe::errc::timeout, "x")));
  return out;
}

}  // namespace troupe::fuzz
