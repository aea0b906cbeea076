#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <random>
#include <unordered_map>

#include <troupe/rpc/serializer.hpp>

namespace demo {

enum class color : std::uint8_t { red, green };

struct point {
  int x = 0;
  double y = 0;
  std::string label;
  friend bool operator==(const point&, const point&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, point& p) {
  return f(troupe::rpc::meta::type_name("point"), p.x, p.y, p.label);
}

// An annotation family defined elsewhere, as CAF's are: it does not derive from ours.
struct foreign_annotation {};
struct foreign_type_name : foreign_annotation {
  const char* value;
};

struct shape {
  std::vector<point> corners;
  std::optional<color> fill;
  std::map<std::string, std::vector<std::int64_t>> tags;
  friend bool operator==(const shape&, const shape&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shape& s) {
  if (auto err = f(foreign_type_name{{}, "shape"}, s.corners)) return err;
  return f(s.fill, s.tags);
}

}  // namespace demo

// The hook the actors layer uses for CAF's annotations, shown here on a local family.
template <class T>
struct troupe::rpc::is_annotation<T,
                                  std::enable_if_t<std::is_base_of_v<demo::foreign_annotation, T>>>
    : std::true_type {};

using namespace troupe;
using namespace troupe::rpc;

template <class T>
T round_trip(const T& in) {
  bytes buf;
  REQUIRE(serialize(buf, nullptr, in));
  T out{};
  auto r = deserialize(buf, nullptr, out);
  REQUIRE_MESSAGE(r, (r ? "" : r.error().to_string()));
  return out;
}

TEST_CASE("built-in types survive a round trip") {
  CHECK(round_trip(42) == 42);
  CHECK(round_trip(-7.5) == -7.5);
  CHECK(round_trip(true) == true);
  CHECK(round_trip(demo::color::green) == demo::color::green);
  CHECK(round_trip(std::string("hello")) == "hello");
  CHECK(round_trip(to_bytes("raw")) == to_bytes("raw"));
  CHECK(round_trip(std::vector<std::string>{"a", "", "ccc"}) ==
        std::vector<std::string>{"a", "", "ccc"});
  CHECK(round_trip(std::array<int, 3>{1, 2, 3}) == std::array<int, 3>{1, 2, 3});
  CHECK(round_trip(std::optional<int>{}) == std::nullopt);
  CHECK(round_trip(std::optional<int>{5}) == 5);
  CHECK(round_trip(std::pair<int, std::string>{1, "x"}) == std::pair<int, std::string>{1, "x"});
  CHECK(round_trip(std::tuple<int, bool, double>{1, false, 2.0}) ==
        std::tuple<int, bool, double>{1, false, 2.0});
  std::unordered_map<std::string, int> um{{"a", 1}, {"b", 2}};
  CHECK(round_trip(um) == um);
  CHECK(round_trip(*device::cuda(3)) == *device::cuda(3));
  CHECK(round_trip(worker_info{"w1", 4}) == worker_info{"w1", 4});
  auto e = round_trip(error(errc::user_error, "boom").with_worker("w2"));
  CHECK(e.code() == errc::user_error);
  CHECK(e.message() == "boom");
  CHECK(e.worker() == "w2");
}

TEST_CASE("a user type with an inspect overload is sendable and its annotations take no bytes") {
  demo::point p{3, 1.5, "corner"};
  CHECK(round_trip(p) == p);
  bytes with_annotation;
  REQUIRE(serialize(with_annotation, nullptr, p));
  bytes fields_only;
  REQUIRE(serialize(fields_only, nullptr, p.x, p.y, p.label));
  CHECK(with_annotation == fields_only);
  demo::shape s{{p, {1, 2, "b"}}, demo::color::red, {{"k", {1, 2, 3}}}};
  CHECK(round_trip(s) == s);
}

TEST_CASE("tensors go to the side list and come back by index") {
  std::vector<tensor> side;
  bytes buf;
  auto t = tensor::from<float>(std::vector<float>{1, 2, 3}, dtype::float32);
  REQUIRE(serialize(buf, &side, std::string("x"), t));
  CHECK(side.size() == 1);
  CHECK(buf.size() == 4 + 1 + 4);
  std::string s;
  tensor back;
  REQUIRE(deserialize(buf, &side, s, back));
  CHECK(same_values(back, t));
  std::vector<tensor> none;
  auto r = deserialize(buf, &none, s, back);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::protocol_error);
}

TEST_CASE("truncated or hostile input fails with a protocol error instead of allocating") {
  demo::shape s{{{1, 2, "abc"}}, demo::color::green, {{"k", {1}}}};
  bytes buf;
  REQUIRE(serialize(buf, nullptr, s));
  for (std::size_t n = 0; n < buf.size(); ++n) {
    demo::shape out;
    auto r = deserialize(std::span(buf.data(), n), nullptr, out);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::protocol_error);
  }
  bytes huge = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}};
  std::vector<std::string> v;
  auto r = deserialize(huge, nullptr, v);
  REQUIRE_FALSE(r);
  CHECK(r.error().message().find("claims") != std::string::npos);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    bytes junk(rng() % 64);
    for (auto& b : junk) b = static_cast<std::byte>(rng());
    demo::shape out;
    (void)deserialize(junk, nullptr, out);
  }
}
