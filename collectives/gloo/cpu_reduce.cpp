#include <troupe/collectives/gloo/cpu_reduce.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
  using raw = std::uint16_t;
  using calc = float;
  static calc load(raw v) { return bfloat16_to_float(v); }
  static raw store(calc v) { return float_to_bfloat16(v); }
};

// The element loop. GCC's -O2 leaves loops like this scalar (its "very cheap" vector cost
// model refuses any loop that needs an alias check or a remainder), which made the sum
// about 1.5x slower than a plain compiled loop; the dynamic cost model vectorizes it, with
// a runtime check that handles `out` aliasing `a` or `b`.
template <dtype D, class Op>
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void apply(Op op, void* out,
                                                                                  const void* a,
                                                                                  const void* b,
                                                                                  std::size_t n) {
  using E = elem<D>;
  using raw = typename E::raw;
  using C = typename E::calc;
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
cpu_reduce_fn make(Op op) {
  // Integer arithmetic wraps like the GPU does (see the ops below: computed unsigned).
  return
      [op](void* out, const void* a, const void* b, std::size_t n) { apply<D>(op, out, a, b, n); };
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
cpu_reduce_fn for_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return make<D>(add_op{});
    case reduce_op::product:
      return make<D>(mul_op{});
    case reduce_op::min:
      return make<D>(min_op{});
    case reduce_op::max:
      return make<D>(max_op{});
  }
  return {};
}

template <dtype D>
void divide(void* data, std::size_t n, std::size_t by) {
  using E = elem<D>;
  auto* p = static_cast<typename E::raw*>(data);
  using C = typename E::calc;
  for (std::size_t i = 0; i < n; ++i) p[i] = E::store(E::load(p[i]) / static_cast<C>(by));
}

}  // namespace

bool cpu_supports(dtype type, reduce_op op) noexcept {
  // No reduction of booleans: a sum of flags is not a flag. Moving them is fine.
  if (type == dtype::boolean || element_size(type) == 0) return false;
  return op != reduce_op::avg || is_floating(type);
}

expected<cpu_reduce_fn> cpu_reduce(dtype type, reduce_op op) {
  if (!cpu_supports(type, op))
    return make_error(
        errc::unsupported, "reduce op ", to_string(op), " is not supported on ", to_string(type),
        type == dtype::boolean ? " tensors (a reduction of flags is not defined here); reduce them "
                                 "as uint8 and compare with zero"
                               : " tensors (an integer average would truncate); use sum "
                                 "and divide, or a floating dtype");
  switch (type) {
    case dtype::float32:
      return for_op<dtype::float32>(op);
    case dtype::float64:
      return for_op<dtype::float64>(op);
    case dtype::float16:
      return for_op<dtype::float16>(op);
    case dtype::bfloat16:
      return for_op<dtype::bfloat16>(op);
    case dtype::int32:
      return for_op<dtype::int32>(op);
    case dtype::int64:
      return for_op<dtype::int64>(op);
    case dtype::uint8:
      return for_op<dtype::uint8>(op);
    case dtype::int8:
      return for_op<dtype::int8>(op);
    case dtype::int16:
      return for_op<dtype::int16>(op);
    case dtype::boolean:
      break;
  }
  return make_error(errc::invalid_argument, "unknown dtype ", static_cast<int>(type));
}

void cpu_divide(tensor_view t, std::size_t divisor) {
  switch (t.type) {
    case dtype::float32:
      return divide<dtype::float32>(t.data, t.numel, divisor);
    case dtype::float64:
      return divide<dtype::float64>(t.data, t.numel, divisor);
    case dtype::float16:
      return divide<dtype::float16>(t.data, t.numel, divisor);
    case dtype::bfloat16:
      return divide<dtype::bfloat16>(t.data, t.numel, divisor);
    default:
      return;
  }
}

}  // namespace troupe::collectives
