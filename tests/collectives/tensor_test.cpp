#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <troupe/collectives/tensor.hpp>

using namespace troupe;
using namespace troupe::collectives;

TEST_CASE("every dtype has its element size and name") {
  CHECK(element_size(dtype::float32) == 4);
  CHECK(element_size(dtype::float64) == 8);
  CHECK(element_size(dtype::float16) == 2);
  CHECK(element_size(dtype::bfloat16) == 2);
  CHECK(element_size(dtype::int32) == 4);
  CHECK(element_size(dtype::int64) == 8);
  CHECK(element_size(dtype::uint8) == 1);
  CHECK(element_size(dtype::int8) == 1);
  CHECK(element_size(dtype::int16) == 2);
  CHECK(element_size(dtype::boolean) == 1);
  CHECK(to_string(dtype::bfloat16) == "bfloat16");
  CHECK(to_string(reduce_op::product) == "product");
  CHECK(is_floating(dtype::float16));
  CHECK_FALSE(is_floating(dtype::uint8));
}

TEST_CASE("half and bfloat16 conversions round trip small integers and round to nearest even") {
  for (int i = -2048; i <= 2048; ++i)
    CHECK(half_to_float(float_to_half(static_cast<float>(i))) == static_cast<float>(i));
  for (int i = -256; i <= 256; ++i)
    CHECK(bfloat16_to_float(float_to_bfloat16(static_cast<float>(i))) == static_cast<float>(i));
  CHECK(half_to_float(float_to_half(2049.0f)) == 2048.0f);  // tie goes to even
  CHECK(half_to_float(float_to_half(0.1f)) == doctest::Approx(0.1f).epsilon(1e-3));
  CHECK(std::isinf(half_to_float(float_to_half(1e6f))));
  CHECK(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(half_to_float(float_to_half(6e-8f)) > 0.0f);  // subnormal survives
  CHECK(bfloat16_to_float(float_to_bfloat16(257.0f)) == 256.0f);
}

TEST_CASE("a tensor view describes a span and slices by elements") {
  std::vector<double> v(10);
  auto t = tensor_view::of(std::span(v));
  CHECK(t.type == dtype::float64);
  CHECK(t.numel == 10);
  CHECK(t.nbytes() == 80);
  CHECK(t.slice(3, 2).data == &v[3]);
  CHECK(check_tensor(t, "input", false));
  auto on_gpu = check_tensor(t, "input", true);
  REQUIRE_FALSE(on_gpu);
  CHECK(on_gpu.error().code() == errc::invalid_argument);
  CHECK(on_gpu.error().message().find("cpu") != std::string::npos);
  tensor_view null_data{nullptr, dtype::int32, 3, device::cpu()};
  CHECK_FALSE(check_tensor(null_data, "input", false));
}
