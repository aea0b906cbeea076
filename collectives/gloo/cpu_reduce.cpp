#include <troupe/collectives/gloo/cpu_reduce.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace troupe::collectives {

namespace {

// Loads and stores through float for the 16-bit types; plain values otherwise.
template <class T>
struct plain_elem {
  using raw = T;
  using calc = T;
  static calc load(raw v) { return v; }
  static raw store(calc v) { return v; }
};
template <dtype D>
struct elem;
template <>
struct elem<dtype::float32> : plain_elem<float> {};
template <>
struct elem<dtype::float64> : plain_elem<double> {};
template <>
struct elem<dtype::int32> : plain_elem<std::int32_t> {};
template <>
struct elem<dtype::int64> : plain_elem<std::int64_t> {};
template <>
struct elem<dtype::uint8> : plain_elem<std::uint8_t> {};
template <>
struct elem<dtype::int8> : plain_elem<std::int8_t> {};
template <>
struct elem<dtype::int16> : plain_elem<std::int16_t> {};
template <>
struct elem<dtype::float16> {
  using raw = std::uint16_t;
  using calc = float;
  static calc load(raw v) { return half_to_float(v); }
  static raw store(calc v) { return float_to_half(v); }
};
template <>
struct elem<dtype::bfloat16> {
  // Inline and without branches (the NaN test is a select), so that the loops vectorize:
  // the same results as bfloat16_to_float and float_to_bfloat16 (tensor.cpp).
  using raw = std::uint16_t;
  using calc = float;
  static calc load(raw v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16); }
  static raw store(calc v) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (x >> 16) | 0x40u;
    return static_cast<raw>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

// The element loops. GCC's -O2 leaves loops like these scalar (its "very cheap" vector cost
// model refuses any loop that needs an alias check or a remainder), which made the sum
// about 1.5x slower than a plain compiled loop; the dynamic cost model vectorizes them,
// with a runtime check that handles `out` aliasing `a` or `b`. Each loop is built twice:
// for the baseline x86-64 (16-byte vectors), and for CPUs with AVX2 and F16C (32-byte
// vectors, and float16 converted by the F16C instructions instead of one call per element).
#define TROUPE_VECTOR_LOOP __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#if defined(__x86_64__)
#define TROUPE_AVX2 __attribute__((target("avx2,f16c")))
#endif

template <dtype D, class Op>
[[gnu::always_inline]] inline void apply_body(void* out, const void* a, const void* b,
                                              std::size_t n) {
  using E = elem<D>;
  using raw = typename E::raw;
  using C = typename E::calc;
  const Op op{};
  auto* o = static_cast<raw*>(out);
  const auto* x = static_cast<const raw*>(a);
  const auto* y = static_cast<const raw*>(b);
  if constexpr (std::is_same_v<raw, C>) {
    for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<raw>(op(x[i], y[i]));
  } else {
    for (std::size_t i = 0; i < n; ++i)
      o[i] = E::store(static_cast<C>(op(E::load(x[i]), E::load(y[i]))));
  }
}

template <dtype D, class Op>
TROUPE_VECTOR_LOOP void apply(void* out, const void* a, const void* b, std::size_t n) {
  apply_body<D, Op>(out, a, b, n);
}

template <dtype D>
[[gnu::always_inline]] inline void divide_body(void* data, std::size_t n, std::size_t by) {
  using E = elem<D>;
  auto* p = static_cast<typename E::raw*>(data);
  using C = typename E::calc;
  const auto d = static_cast<C>(by);
  for (std::size_t i = 0; i < n; ++i) p[i] = E::store(E::load(p[i]) / d);
}

template <dtype D>
TROUPE_VECTOR_LOOP void divide(void* data, std::size_t n, std::size_t by) {
  divide_body<D>(data, n, by);
}

#if defined(TROUPE_AVX2)
// float16 through float, a block at a time: the block's halves are converted by F16C,
// combined by the float loop (the same operation as elsewhere), and converted back with
// rounding to nearest even. The tail goes through the scalar conversions, which give the
// same bits (tensor.cpp).
constexpr std::size_t half_block = 256;

TROUPE_AVX2 inline void halves_to_floats(float* to, const std::uint16_t* from, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(to + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i))));
  for (; i < n; ++i) to[i] = half_to_float(from[i]);
}
TROUPE_AVX2 inline void floats_to_halves(std::uint16_t* to, const float* from, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) to[i] = float_to_half(from[i]);
}

template <dtype D, class Op>
TROUPE_AVX2 TROUPE_VECTOR_LOOP void apply_avx2(void* out, const void* a, const void* b,
                                               std::size_t n) {
  if constexpr (D == dtype::float16) {
    alignas(32) float fa[half_block], fb[half_block];
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    auto* o = static_cast<std::uint16_t*>(out);
    for (std::size_t off = 0; off < n; off += half_block) {
      const std::size_t k = std::min(half_block, n - off);
      halves_to_floats(fa, x + off, k);
      halves_to_floats(fb, y + off, k);
      apply_body<dtype::float32, Op>(fa, fa, fb, k);
      floats_to_halves(o + off, fa, k);
    }
  } else {
    apply_body<D, Op>(out, a, b, n);
  }
}

template <dtype D>
TROUPE_AVX2 TROUPE_VECTOR_LOOP void divide_avx2(void* data, std::size_t n, std::size_t by) {
  if constexpr (D == dtype::float16) {
    alignas(32) float f[half_block];
    auto* p = static_cast<std::uint16_t*>(data);
    const auto d = static_cast<float>(by);
    for (std::size_t off = 0; off < n; off += half_block) {
      const std::size_t k = std::min(half_block, n - off);
      halves_to_floats(f, p + off, k);
      for (std::size_t i = 0; i < k; ++i) f[i] /= d;
      floats_to_halves(p + off, f, k);
    }
  } else {
    divide_body<D>(data, n, by);
  }
}
#endif

// Whether this CPU runs the AVX2 loops.
bool avx2(cpu_isa isa) noexcept {
#if defined(TROUPE_AVX2)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return isa == cpu_isa::best && has;
#else
  (void)isa;
  return false;
#endif
}

template <dtype D, class Op>
cpu_reduce_fn make(cpu_isa isa) {
  // Integer arithmetic wraps like the GPU does (see the ops below: computed unsigned).
#if defined(TROUPE_AVX2)
  if (avx2(isa)) return &apply_avx2<D, Op>;
#endif
  (void)isa;
  return &apply<D, Op>;
}

struct add_op {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) +
                            static_cast<std::make_unsigned_t<T>>(b));
    else
      return a + b;
  }
};
struct mul_op {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U =
          std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct min_op {
  template <class T>
  T operator()(T a, T b) const {
    return std::min(a, b);
  }
};
struct max_op {
  template <class T>
  T operator()(T a, T b) const {
    return std::max(a, b);
  }
};

template <dtype D>
cpu_reduce_fn for_op(reduce_op op, cpu_isa isa) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return make<D, add_op>(isa);
    case reduce_op::product:
      return make<D, mul_op>(isa);
    case reduce_op::min:
      return make<D, min_op>(isa);
    case reduce_op::max:
      return make<D, max_op>(isa);
  }
  return {};
}

}  // namespace

bool cpu_supports(dtype type, reduce_op op) noexcept {
  // No reduction of booleans: a sum of flags is not a flag. Moving them is fine.
  if (type == dtype::boolean || element_size(type) == 0) return false;
  return op != reduce_op::avg || is_floating(type);
}

expected<cpu_reduce_fn> cpu_reduce(dtype type, reduce_op op, cpu_isa isa) {
  if (!cpu_supports(type, op))
    return make_error(
        errc::unsupported, "reduce op ", to_string(op), " is not supported on ", to_string(type),
        type == dtype::boolean ? " tensors (a reduction of flags is not defined here); reduce them "
                                 "as uint8 and compare with zero"
                               : " tensors (an integer average would truncate); use sum "
                                 "and divide, or a floating dtype");
  switch (type) {
    case dtype::float32:
      return for_op<dtype::float32>(op, isa);
    case dtype::float64:
      return for_op<dtype::float64>(op, isa);
    case dtype::float16:
      return for_op<dtype::float16>(op, isa);
    case dtype::bfloat16:
      return for_op<dtype::bfloat16>(op, isa);
    case dtype::int32:
      return for_op<dtype::int32>(op, isa);
    case dtype::int64:
      return for_op<dtype::int64>(op, isa);
    case dtype::uint8:
      return for_op<dtype::uint8>(op, isa);
    case dtype::int8:
      return for_op<dtype::int8>(op, isa);
    case dtype::int16:
      return for_op<dtype::int16>(op, isa);
    case dtype::boolean:
      break;
  }
  return make_error(errc::invalid_argument, "unknown dtype ", static_cast<int>(type));
}

void cpu_divide(tensor_view t, std::size_t divisor, cpu_isa isa) {
  auto run = [&]<dtype D>() {
#if defined(TROUPE_AVX2)
    if (avx2(isa)) return divide_avx2<D>(t.data, t.numel, divisor);
#endif
    divide<D>(t.data, t.numel, divisor);
  };
  switch (t.type) {
    case dtype::float32:
      return run.template operator()<dtype::float32>();
    case dtype::float64:
      return run.template operator()<dtype::float64>();
    case dtype::float16:
      return run.template operator()<dtype::float16>();
    case dtype::bfloat16:
      return run.template operator()<dtype::bfloat16>();
    default:
      return;
  }
}

}  // namespace troupe::collectives
