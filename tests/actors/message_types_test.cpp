// Remote message encoding: built-ins, user types with CAF annotations, tensors beside the
// bytes, and the errors for unregistered or malformed input.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <troupe/actors/message_types.hpp>

namespace {

using troupe::errc;
using troupe::actors::message_types;
using namespace std::string_literals;

struct point {
  std::int32_t x = 0;
  std::int32_t y = 0;
  std::string label;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, point& p) {
  return f(caf::meta::type_name("point"), p.x, p.y, p.label);
}

struct gradient {
  std::uint64_t step = 0;
  troupe::tensor values;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gradient& g) {
  return f(caf::meta::type_name("gradient"), g.step, g.values);
}

struct never_registered {
  int v = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, never_registered& n) {
  return f(n.v);
}

using ping_atom = caf::atom_constant<caf::atom("ping")>;

}  // namespace

TEST_CASE("built-in elements and a registered user type survive the round trip") {
  message_types types;
  REQUIRE(types.add<point>("point"));
  auto m =
      caf::make_message(ping_atom::value, std::int32_t{-7}, std::uint64_t{1} << 40, 2.5, "hello"s,
                        true, point{3, 4, "corner"}, std::vector<std::string>{"a", "b"});
  troupe::bytes out;
  REQUIRE(types.encode(m, out, nullptr));
  auto back = types.decode(out, nullptr);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  REQUIRE(back->size() == 8);
  CHECK(back->get_as<caf::atom_value>(0) == ping_atom::value);
  CHECK(back->get_as<std::int32_t>(1) == -7);
  CHECK(back->get_as<std::uint64_t>(2) == std::uint64_t{1} << 40);
  CHECK(back->get_as<double>(3) == 2.5);
  CHECK(back->get_as<std::string>(4) == "hello");
  CHECK(back->get_as<bool>(5));
  const auto& p = back->get_as<point>(6);
  CHECK(p.x == 3);
  CHECK(p.y == 4);
  CHECK(p.label == "corner");
  CHECK(back->get_as<std::vector<std::string>>(7) == std::vector<std::string>{"a", "b"});
}

TEST_CASE("a tensor inside a message travels beside the bytes, not inside them") {
  message_types types;
  REQUIRE(types.add<gradient>("gradient"));
  std::vector<float> v(1024, 0.5f);
  auto t = troupe::tensor::from<float>(v, troupe::dtype::float32);
  troupe::bytes out;
  std::vector<troupe::tensor> side;
  REQUIRE(types.encode(caf::make_message(gradient{9, t}), out, &side));
  CHECK(side.size() == 1);
  CHECK(out.size() < 64);  // the 4 KiB of values are not in the message bytes
  auto back = types.decode(out, &side);
  REQUIRE(back.has_value());
  const auto& g = back->get_as<gradient>(0);
  CHECK(g.step == 9);
  CHECK(g.values.numel() == 1024);
  CHECK(g.values.as_span<float>()[1023] == 0.5f);
}

TEST_CASE("an unregistered element type is refused with its name on both sides") {
  message_types sender;
  troupe::bytes out;
  auto r = sender.encode(caf::make_message(never_registered{1}), out, nullptr);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::unsupported);
  CHECK(r.error().message().find("never_registered") != std::string::npos);
  CHECK(r.error().message().find("add_message_type") != std::string::npos);

  message_types with_point, without_point;
  REQUIRE(with_point.add<point>("point"));
  troupe::bytes bytes;
  REQUIRE(with_point.encode(caf::make_message(point{}), bytes, nullptr));
  auto d = without_point.decode(bytes, nullptr);
  REQUIRE_FALSE(d.has_value());
  CHECK(d.error().code() == errc::unsupported);
  CHECK(d.error().message().find("'point'") != std::string::npos);
}

TEST_CASE("registering names twice or for two types is refused, the same registration is not") {
  message_types types;
  REQUIRE(types.add<point>("point"));
  CHECK(types.add<point>("point").has_value());
  auto other_name = types.add<point>("pt");
  REQUIRE_FALSE(other_name.has_value());
  CHECK(other_name.error().message().find("already registered as 'point'") != std::string::npos);
  auto taken = types.add<never_registered>("point");
  REQUIRE_FALSE(taken.has_value());
  CHECK(taken.error().message().find("already taken") != std::string::npos);
  CHECK_FALSE(types.add<never_registered>("").has_value());
  CHECK_FALSE(types.add<never_registered>("@mine").has_value());
}

TEST_CASE("truncated and corrupted message bytes fail with protocol_error, never crash") {
  message_types types;
  REQUIRE(types.add<point>("point"));
  troupe::bytes good;
  REQUIRE(
      types.encode(caf::make_message("abc"s, point{1, 2, "p"}, std::int64_t{5}), good, nullptr));
  for (std::size_t n = 0; n < good.size(); ++n) {
    auto r = types.decode(std::span(good).first(n), nullptr);
    CHECK_FALSE(r.has_value());
  }
  troupe::bytes extra = good;
  extra.push_back(std::byte{0});
  CHECK(types.decode(extra, nullptr).error().code() == errc::protocol_error);
  troupe::bytes bad_code = good;
  bad_code[2] = std::byte{200};  // the first element's type code
  CHECK(types.decode(bad_code, nullptr).error().code() == errc::protocol_error);
}
