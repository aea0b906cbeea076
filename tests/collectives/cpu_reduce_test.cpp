#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <troupe/collectives/gloo/cpu_reduce.hpp>

using namespace troupe;
using namespace troupe::collectives;

namespace {

constexpr reduce_op float_ops[] = {reduce_op::sum, reduce_op::product, reduce_op::min,
                                   reduce_op::max};

// Every 16-bit pattern (NaNs, infinities, subnormals and zeros of both signs included), and
// the same patterns in another order, as two inputs.
std::vector<std::uint16_t> every_half() {
  std::vector<std::uint16_t> v(65536);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i);
  return v;
}
std::vector<std::uint16_t> every_half_shuffled() {
  std::vector<std::uint16_t> v(65536);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i * 40503u + 7u);
  return v;
}

float widen(dtype t, std::uint16_t v) {
  return t == dtype::float16 ? half_to_float(v) : bfloat16_to_float(v);
}
std::uint16_t narrow(dtype t, float f) {
  return t == dtype::float16 ? float_to_half(f) : float_to_bfloat16(f);
}
// The element-wise definition, one element at a time through the scalar conversions.
float combine(reduce_op op, float a, float b) {
  switch (op) {
    case reduce_op::product:
      return a * b;
    case reduce_op::min:
      return std::min(a, b);
    case reduce_op::max:
      return std::max(a, b);
    default:
      return a + b;
  }
}

bool is_nan(dtype t, std::uint16_t v) { return std::isnan(widen(t, v)); }
// Equal bits; or, where both inputs are NaNs, any NaN: which of the two an addition or a
// product passes on is the compiler's choice of operand order (x86 returns the first).
bool same_result(dtype t, std::uint16_t got, std::uint16_t want, std::uint16_t a, std::uint16_t b) {
  if (got == want) return true;
  return is_nan(t, a) && is_nan(t, b) && is_nan(t, got) && is_nan(t, want);
}

std::vector<std::uint16_t> reduce_with(dtype t, reduce_op op, cpu_isa isa,
                                       const std::vector<std::uint16_t>& a,
                                       const std::vector<std::uint16_t>& b) {
  std::vector<std::uint16_t> out(a.size());
  (*cpu_reduce(t, op, isa))(out.data(), a.data(), b.data(), a.size());
  return out;
}

}  // namespace

TEST_CASE("half-precision reductions give the bits of the scalar definition for every input") {
  // Every pair of NaNs aside, where the payload passed on is the compiler's choice.
  const auto a = every_half();
  const auto b = every_half_shuffled();
  for (dtype t : {dtype::float16, dtype::bfloat16}) {
    for (reduce_op op : float_ops) {
      CAPTURE(to_string(t));
      CAPTURE(to_string(op));
      std::vector<std::uint16_t> expected(a.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        expected[i] = narrow(t, combine(op, widen(t, a[i]), widen(t, b[i])));
      const auto best = reduce_with(t, op, cpu_isa::best, a, b);
      const auto baseline = reduce_with(t, op, cpu_isa::baseline, a, b);
      std::size_t best_wrong = 0, baseline_wrong = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        best_wrong += !same_result(t, best[i], expected[i], a[i], b[i]);
        baseline_wrong += !same_result(t, baseline[i], expected[i], a[i], b[i]);
      }
      CHECK(best_wrong == 0);
      CHECK(baseline_wrong == 0);
    }
  }
}

TEST_CASE("every reduction loop handles short tails and an output that is one of its inputs") {
  std::mt19937 rng(7);
  const dtype types[] = {dtype::float32,  dtype::float64, dtype::float16,
                         dtype::bfloat16, dtype::int32,   dtype::int64,
                         dtype::uint8,    dtype::int8,    dtype::int16};
  for (dtype t : types) {
    for (reduce_op op : float_ops) {
      for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 255u, 256u, 257u, 1000u}) {
        CAPTURE(to_string(t));
        CAPTURE(to_string(op));
        CAPTURE(n);
        const std::size_t bytes = n * element_size(t);
        std::vector<unsigned char> a(bytes), b(bytes);
        // Small values, so that integer products and 16-bit sums stay meaningful.
        for (std::size_t i = 0; i < n; ++i) {
          const int va = static_cast<int>(rng() % 7) - 3, vb = static_cast<int>(rng() % 7) - 3;
          auto put = [&](std::vector<unsigned char>& to, int v) {
            unsigned char* p = to.data() + i * element_size(t);
            switch (t) {
              case dtype::float32: {
                const float f = static_cast<float>(v) * 0.75f;
                std::memcpy(p, &f, 4);
                break;
              }
              case dtype::float64: {
                const double d = v * 0.75;
                std::memcpy(p, &d, 8);
                break;
              }
              case dtype::float16:
              case dtype::bfloat16: {
                const std::uint16_t h = narrow(t, static_cast<float>(v) * 0.75f);
                std::memcpy(p, &h, 2);
                break;
              }
              default: {
                const std::int64_t w = v;
                std::memcpy(p, &w, element_size(t));  // little-endian: the low bytes
              }
            }
          };
          put(a, va);
          put(b, vb);
        }
        const auto base = *cpu_reduce(t, op, cpu_isa::baseline);
        const auto best = *cpu_reduce(t, op, cpu_isa::best);
        std::vector<unsigned char> want(bytes), got(bytes);
        if (n > 0) base(want.data(), a.data(), b.data(), n);
        if (n > 0) best(got.data(), a.data(), b.data(), n);
        CHECK(got == want);
        // In place, on either side (the shared-memory allreduce folds into its input).
        auto into_a = a, into_b = b;
        if (n > 0) best(into_a.data(), into_a.data(), b.data(), n);
        if (n > 0) best(into_b.data(), a.data(), into_b.data(), n);
        CHECK(into_a == want);
        CHECK(into_b == want);
      }
    }
  }
}

TEST_CASE("the average's division gives the same bits on every loop") {
  const auto halves = every_half();
  for (dtype t : {dtype::float16, dtype::bfloat16}) {
    for (std::size_t by : {2u, 3u, 7u}) {
      CAPTURE(to_string(t));
      CAPTURE(by);
      auto best = halves, baseline = halves;
      cpu_divide({best.data(), t, best.size(), device::cpu()}, by, cpu_isa::best);
      cpu_divide({baseline.data(), t, baseline.size(), device::cpu()}, by, cpu_isa::baseline);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < halves.size(); ++i) {
        const auto expected = narrow(t, widen(t, halves[i]) / static_cast<float>(by));
        wrong += best[i] != expected || baseline[i] != expected;
      }
      CHECK(wrong == 0);
    }
  }
  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.37f;
  auto best = f, baseline = f;
  cpu_divide({best.data(), dtype::float32, best.size(), device::cpu()}, 3, cpu_isa::best);
  cpu_divide({baseline.data(), dtype::float32, baseline.size(), device::cpu()}, 3,
             cpu_isa::baseline);
  CHECK(best == baseline);
  CHECK(best[999] == f[999] / 3.0f);
}
