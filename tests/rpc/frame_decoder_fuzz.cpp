// libFuzzer target over the frame decoder and the message deserializer. Built only with
// clang (-DTROUPE_BUILD_FUZZERS=ON); CI runs it for a bounded time:
//   rpc_frame_fuzz -max_total_time=30 -rss_limit_mb=1024
#include <cstddef>
#include <cstdint>
#include <string>

#include "rpc/serializer.hpp"
#include "rpc/wire.hpp"

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
    tensor t;
    (void)deserialize(f.message, &f.tensors, name, v, e, t);
  }
  return 0;
}
