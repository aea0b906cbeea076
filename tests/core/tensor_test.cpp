#include <doctest/doctest.h>

#include <vector>

#include <troupe/core/tensor.hpp>

using namespace troupe;

TEST_CASE("dtype values are the ones RPC frames carry, and every one has a size and a name") {
  // docs/rpc-wire.md lists these numbers; changing one breaks every peer of another build.
  CHECK(static_cast<int>(dtype::uint8) == 0);
  CHECK(static_cast<int>(dtype::int8) == 1);
  CHECK(static_cast<int>(dtype::int16) == 2);
  CHECK(static_cast<int>(dtype::int32) == 3);
  CHECK(static_cast<int>(dtype::int64) == 4);
  CHECK(static_cast<int>(dtype::float16) == 5);
  CHECK(static_cast<int>(dtype::bfloat16) == 6);
  CHECK(static_cast<int>(dtype::float32) == 7);
  CHECK(static_cast<int>(dtype::float64) == 8);
  CHECK(static_cast<int>(dtype::boolean) == 9);
  for (int raw = 0; raw <= 9; ++raw) {
    CAPTURE(raw);
    auto t = static_cast<dtype>(raw);
    CHECK(is_valid_dtype(static_cast<std::uint8_t>(raw)));
    CHECK(element_size(t) > 0);
    CHECK(to_string(t) != "invalid");
  }
  CHECK_FALSE(is_valid_dtype(10));
  CHECK(element_size(static_cast<dtype>(10)) == 0);
  CHECK(to_string(dtype::boolean) == "bool");
  CHECK(to_string(dtype::float32) == "float32");
  CHECK(is_floating(dtype::bfloat16));
  CHECK_FALSE(is_floating(dtype::int16));
  CHECK(dtype_of<std::int16_t>() == dtype::int16);
  CHECK(dtype_of<bool>() == dtype::boolean);
}

TEST_CASE("a contiguous tensor gives its flat view and a view becomes a 1-D tensor") {
  auto t = tensor::zeros(dtype::float32, {2, 3});
  auto v = t.view();
  REQUIRE(v);
  CHECK(v->data == t.data());
  CHECK(v->type == dtype::float32);
  CHECK(v->numel == 6);
  CHECK(v->where == device::cpu());
  CHECK(v->nbytes() == 24);

  auto back = tensor::wrap(*v);
  CHECK(back.data() == t.data());
  CHECK(back.shape() == std::vector<std::int64_t>{6});
  CHECK(back.type() == dtype::float32);
  CHECK(back.owner() == nullptr);  // a view owns nothing, nor does the tensor over it
}

TEST_CASE("a strided tensor refuses a flat view and says how to get one") {
  std::vector<float> data(6);
  auto columns = tensor::wrap(data.data(), dtype::float32, {3, 2}, device::cpu(), {1, 3});
  REQUIRE(columns);
  CHECK_FALSE(columns->is_contiguous());
  auto v = columns->view();
  REQUIRE_FALSE(v);
  CHECK(v.error().code() == errc::invalid_argument);
  CHECK(v.error().message().find("contiguous()") != std::string::npos);
  CHECK(columns->contiguous().view());
}

TEST_CASE("wrapping refuses a dtype outside the enum") {
  float x = 0;
  auto t = tensor::wrap(&x, static_cast<dtype>(42), {1});
  REQUIRE_FALSE(t);
  CHECK(t.error().code() == errc::invalid_argument);
}
