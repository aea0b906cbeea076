// Fuzz target over the RPC handshake as the accepting side reads it: a frame decoder held
// to the pre-handshake limits, then the handshake message's fields.
#include <cstddef>
#include <cstdint>
#include <string>

#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/serializer.hpp>
#include <troupe/rpc/wire.hpp>
#include "fuzz/fuzz_seeds.hpp"

using namespace troupe::rpc;
using troupe::worker_info;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wire::frame_decoder d(wire::limits{4096, 0, 0});  // what an agent accepts before a handshake
  std::vector<wire::frame> out;
  auto in = std::span(reinterpret_cast<const std::byte*>(data), size);
  if (!d.feed(in, out)) return 0;
  for (auto& f : out) {
    std::uint32_t protocol = 0;
    std::string token, group;
    worker_info who;
    (void)deserialize(f.message, nullptr, protocol, token, who, group);
    worker_info peer;
    (void)deserialize(f.message, nullptr, peer);  // a handshake_ok's body
    std::string nonce, proof;
    (void)deserialize(f.message, nullptr, nonce, proof);  // a handshake_challenge's body
    (void)deserialize(f.message, nullptr, proof);         // a handshake_auth's body
  }
  return 0;
}

namespace troupe::fuzz {

std::vector<std::vector<std::uint8_t>> seeds() {
  wire::frame_builder hs(wire::kind::handshake, 0);
  std::uint32_t protocol = wire::version;
  (void)serialize(hs.message(), nullptr, protocol, std::string("token"), worker_info{"w0", 0},
                  std::string("troupe/rpc"));
  (void)hs.finish();
  wire::frame_builder ch(wire::kind::handshake_challenge, 0);
  (void)serialize(ch.message(), nullptr, std::string(16, 'n'), std::string(32, 'p'));
  (void)ch.finish();
  std::vector<std::vector<std::uint8_t>> out;
  for (auto* fb : {&hs, &ch}) {
    auto h = fb->head();
    auto* p = reinterpret_cast<const std::uint8_t*>(h.data());
    out.emplace_back(p, p + h.size());
  }
  return out;
}

}  // namespace troupe::fuzz
