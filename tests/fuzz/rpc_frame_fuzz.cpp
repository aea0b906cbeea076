// Fuzz target over the RPC frame decoder and the message deserializer (tests/fuzz/README
// in tests/fuzz/CMakeLists.txt says how it is built and run).
#include <cstddef>
#include <cstdint>
#include <string>

#include <troupe/rpc/serializer.hpp>
#include <troupe/rpc/wire.hpp>
#include "fuzz/fuzz_seeds.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::rpc;
  wire::limits lim;
  lim.max_message = 1 << 16;
  lim.max_payload = 1 << 20;
  lim.max_tensors = 64;
  wire::frame_decoder d(lim);
  std::vector<wire::frame> out;
  auto in = std::span(reinterpret_cast<const std::byte*>(data), size);
  // Feed in two pieces to exercise the incremental paths.
  auto half = size / 2;
  if (d.feed(in.first(half), out)) (void)d.feed(in.subspan(half), out);
  for (auto& f : out) {
    std::string name;
    std::vector<std::int64_t> v;
    troupe::error e;
    troupe::tensor t;
    (void)deserialize(f.message, &f.tensors, name, v, e, t);
  }
  return 0;
}

namespace troupe::fuzz {

std::vector<std::vector<std::uint8_t>> seeds() {
  using namespace troupe::rpc;
  wire::frame_builder f(wire::kind::request, 3);
  (void)serialize(f.message(), nullptr, std::string("add"), std::vector<std::int64_t>{1, 2});
  (void)f.finish();
  auto h = f.head();
  auto* p = reinterpret_cast<const std::uint8_t*>(h.data());
  return {std::vector<std::uint8_t>(p, p + h.size())};
}

}  // namespace troupe::fuzz
