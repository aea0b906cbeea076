#include <doctest/doctest.h>

#include <random>

#include <troupe/rpc/serializer.hpp>
#include <troupe/rpc/wire.hpp>

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::wire;

namespace {

bytes flatten(const frame_builder& b) {
  bytes out = b.head();
  for (const auto& t : b.payload()) {
    auto* p = static_cast<const std::byte*>(t.data());
    out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

bytes sample_frame(std::uint64_t id) {
  frame_builder b(kind::request, id, 3);
  REQUIRE(serialize(b.message(), &b.tensors(), std::string("add"), 7,
                    tensor::from<std::int32_t>(std::vector<std::int32_t>{1, 2, 3, 4}, dtype::int32),
                    tensor::zeros(dtype::float64, {2, 0}),
                    tensor::from<float>(std::vector<float>{0.5f}, dtype::float32)));
  REQUIRE(b.finish());
  return flatten(b);
}

}  // namespace

TEST_CASE("a frame split at every byte boundary decodes to the same frame") {
  bytes f = sample_frame(42);
  for (std::size_t cut = 0; cut <= f.size(); ++cut) {
    frame_decoder d;
    std::vector<frame> out;
    REQUIRE(d.feed(std::span(f.data(), cut), out));
    REQUIRE(d.feed(std::span(f.data() + cut, f.size() - cut), out));
    REQUIRE(out.size() == 1);
    CHECK(out[0].id == 42);
    CHECK(out[0].flags == 3);
    CHECK(out[0].type == kind::request);
    REQUIRE(out[0].tensors.size() == 3);
    std::string fn;
    int x = 0;
    tensor a, b, c;
    REQUIRE(deserialize(out[0].message, &out[0].tensors, fn, x, a, b, c));
    CHECK(fn == "add");
    CHECK(x == 7);
    CHECK(a.as_span<std::int32_t>()[3] == 4);
    CHECK(b.numel() == 0);
    CHECK(c.as_span<float>()[0] == 0.5f);
  }
}

TEST_CASE("tensor bytes can be received straight into the tensor through the payload window") {
  bytes f = sample_frame(1);
  frame_decoder d;
  std::vector<frame> out;
  // Feed only the head part, then write the payload through the window.
  std::size_t head_len = f.size() - (16 + 4);
  REQUIRE(d.feed(std::span(f.data(), head_len), out));
  std::size_t pos = head_len;
  while (out.empty()) {
    auto w = d.payload_window();
    REQUIRE(!w.empty());
    std::size_t n = std::min<std::size_t>(w.size(), 3);
    std::memcpy(w.data(), f.data() + pos, n);
    pos += n;
    REQUIRE(d.payload_written(n, out));
  }
  CHECK(pos == f.size());
  CHECK(out[0].tensors[0].as_span<std::int32_t>()[2] == 3);
}

TEST_CASE("back-to-back frames in one buffer all come out") {
  bytes all;
  for (std::uint64_t i = 1; i <= 5; ++i) {
    auto f = sample_frame(i);
    all.insert(all.end(), f.begin(), f.end());
  }
  frame_decoder d;
  std::vector<frame> out;
  REQUIRE(d.feed(all, out));
  REQUIRE(out.size() == 5);
  CHECK(out[4].id == 5);
}

TEST_CASE("bad magic, version, kind and oversized sections are refused with a protocol error") {
  auto check_refused = [](bytes f, const limits& lim, std::string_view needle) {
    frame_decoder d(lim);
    std::vector<frame> out;
    auto r = d.feed(f, out);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::protocol_error);
    CHECK_MESSAGE(r.error().message().find(needle) != std::string::npos, r.error().message());
    // The error is sticky.
    CHECK_FALSE(d.feed(f, out));
    CHECK(out.empty());
  };
  bytes f = sample_frame(9);
  bytes bad = f;
  bad[0] = std::byte{'X'};
  check_refused(bad, {}, "magic");
  bad = f;
  bad[4] = std::byte{9};
  check_refused(bad, {}, "version");
  bad = f;
  bad[5] = std::byte{77};
  check_refused(bad, {}, "kind");
  limits small;
  small.max_message = 4;
  check_refused(f, small, "exceeds the limit");
  limits few;
  few.max_tensors = 2;
  check_refused(f, few, "tensors exceeds");
  limits tiny_payload;
  tiny_payload.max_payload = 8;
  check_refused(f, tiny_payload, "payload");
  // A descriptor whose byte count does not match its shape.
  bad = f;
  bad[bad.size() - 4 - 8] = std::byte{5};
  frame_decoder d;
  std::vector<frame> out;
  auto r = d.feed(bad, out);
  CHECK((!r || out.size() == 1));
}

TEST_CASE("random and truncated frames are rejected or left incomplete, never crash") {
  std::mt19937_64 rng(12345);
  bytes good = sample_frame(3);
  limits lim;
  lim.max_message = 1 << 16;
  lim.max_payload = 1 << 20;
  int rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    bytes f = good;
    switch (i % 4) {
      case 0:  // random bytes after a valid magic and version
        for (std::size_t k = 5; k < f.size(); ++k) f[k] = static_cast<std::byte>(rng());
        break;
      case 1:  // a few flipped bytes anywhere
        for (int k = 0; k < 3; ++k) f[rng() % f.size()] = static_cast<std::byte>(rng());
        break;
      case 2:  // truncated
        f.resize(rng() % f.size());
        break;
      default:  // pure noise
        f.resize(rng() % 256);
        for (auto& b : f) b = static_cast<std::byte>(rng());
    }
    frame_decoder d(lim);
    std::vector<frame> out;
    auto r = d.feed(f, out);
    if (!r) {
      ++rejected;
      CHECK(r.error().code() == errc::protocol_error);
    }
    for (auto& fr : out) {
      // Whatever decoded must deserialize safely or fail cleanly.
      std::string fn;
      int x = 0;
      tensor a, b, c;
      (void)deserialize(fr.message, &fr.tensors, fn, x, a, b, c);
    }
  }
  CHECK(rejected > 5000);
}

namespace {

// A receive allocator that hands out one recorded block, as the agent's page-locked pool
// does for tensors bound for a GPU.
struct recorded_allocations {
  std::vector<std::pair<device, std::size_t>> asked;
  std::vector<std::byte*> given;
  bool refuse = false;
};
recorded_allocations recorded;

std::shared_ptr<std::byte> recording_allocator(device dev, std::size_t n) {
  recorded.asked.emplace_back(dev, n);
  if (recorded.refuse) return nullptr;
  auto mem = std::shared_ptr<std::byte>(new std::byte[n], std::default_delete<std::byte[]>());
  recorded.given.push_back(mem.get());
  return mem;
}

bytes gpu_bound_frame() {
  std::vector<float> big(32 * 1024);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  frame_builder b(kind::request, 9, 0);
  REQUIRE(serialize(b.message(), &b.tensors(),
                    tensor::from<float>(big, dtype::float32).with_device(*device::cuda(0)),
                    tensor::from<float>(big, dtype::float32)));
  REQUIRE(b.finish());
  return flatten(b);
}

}  // namespace

TEST_CASE("the bytes of a tensor bound for a GPU land in memory from the receive allocator") {
  recorded = {};
  bytes f = gpu_bound_frame();
  frame_decoder d({}, &recording_allocator);
  std::vector<frame> out;
  REQUIRE(d.feed(f, out));
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].tensors.size() == 2);
  // Only the GPU-bound tensor was asked for, with its device and size.
  REQUIRE(recorded.asked.size() == 1);
  CHECK(recorded.asked[0].first == *device::cuda(0));
  CHECK(recorded.asked[0].second == 32 * 1024 * sizeof(float));
  const tensor& gpu_bound = out[0].tensors[0];
  CHECK(static_cast<const std::byte*>(gpu_bound.data()) == recorded.given[0]);
  CHECK(gpu_bound.dev() == *device::cuda(0));
  CHECK(gpu_bound.as_span<float>()[12345] == 12345.0f);
  CHECK(out[0].tensors[1].as_span<float>()[32767] == 32767.0f);
}

TEST_CASE("a receive allocator that gives nothing leaves the tensor in ordinary memory") {
  recorded = {};
  recorded.refuse = true;
  bytes f = gpu_bound_frame();
  frame_decoder d({}, &recording_allocator);
  std::vector<frame> out;
  REQUIRE(d.feed(f, out));
  REQUIRE(out.size() == 1);
  CHECK(recorded.asked.size() == 1);
  CHECK(out[0].tensors[0].as_span<float>()[777] == 777.0f);
}
