#include <troupe/training/comm_hooks.hpp>

#include <memory>
#include <vector>

#include <troupe/training/flat_views.hpp>

namespace troupe::training {

using collectives::reduce_op;

namespace {

future<void> failed(troupe::error e) { return make_error_future<void>(std::move(e)); }

expected<void> check_bucket(const comm_bucket& b, std::string_view hook) {
  if (!b.group)
    return make_error(errc::invalid_argument, hook, ": the bucket has no process group");
  if (b.divisor <= 0)
    return make_error(errc::invalid_argument, hook, ": divisor ", b.divisor, " is not positive");
  return ok();
}

// Compresses with `to` (float -> 16 bits), reduces as `wire`, decompresses with `from`.
template <std::uint16_t (*to)(float), float (*from)(std::uint16_t)>
future<void> compressed(comm_bucket b, dtype wire, std::string_view name) {
  if (auto c = check_bucket(b, name); !c) return failed(std::move(c).error());
  if (!b.buffer.where.is_cpu() ||
      (b.buffer.type != dtype::float32 && b.buffer.type != dtype::float64))
    return failed(make_error(errc::unsupported, name,
                             " compresses float32 and float64 CPU "
                             "buckets; bucket ",
                             b.index, " is ", to_string(b.buffer.type), " on ",
                             b.buffer.where.to_string()));
  auto packed = std::make_shared<std::vector<std::uint16_t>>(b.buffer.numel);
  const double inv = 1.0 / b.divisor;
  auto compress = [&](auto* src) {
    for (std::size_t i = 0; i < b.buffer.numel; ++i)
      (*packed)[i] = to(static_cast<float>(src[i] * inv));
  };
  if (b.buffer.type == dtype::float32)
    compress(static_cast<const float*>(b.buffer.data));
  else
    compress(static_cast<const double*>(b.buffer.data));
  tensor_view v{packed->data(), wire, packed->size(), device::cpu()};
  auto w = b.group->allreduce(v, {reduce_op::sum, b.timeout});
  return w.get_future().then([packed, out = b.buffer] {
    auto write = [&](auto* dst) {
      using T = std::remove_pointer_t<decltype(dst)>;
      for (std::size_t i = 0; i < out.numel; ++i) dst[i] = static_cast<T>(from((*packed)[i]));
    };
    if (out.type == dtype::float32)
      write(static_cast<float*>(out.data));
    else
      write(static_cast<double*>(out.data));
  });
}

}  // namespace

comm_hook allreduce_hook() {
  return [](comm_bucket b) -> future<void> {
    if (auto c = check_bucket(b, "allreduce hook"); !c) return failed(std::move(c).error());
    auto& g = *b.group;
    if (b.divisor == g.size() && g.supports(b.buffer.type, reduce_op::avg))
      return g.allreduce(b.buffer, {reduce_op::avg, b.timeout}).get_future();
    if (b.divisor != 1)
      if (auto s = scale(b.buffer, 1.0 / b.divisor); !s) return failed(std::move(s).error());
    return g.allreduce(b.buffer, {reduce_op::sum, b.timeout}).get_future();
  };
}

comm_hook fp16_compress_hook() {
  return [](comm_bucket b) {
    return compressed<collectives::float_to_half, collectives::half_to_float>(
        std::move(b), dtype::float16, "fp16_compress hook");
  };
}

comm_hook bf16_compress_hook() {
  return [](comm_bucket b) {
    return compressed<collectives::float_to_bfloat16, collectives::bfloat16_to_float>(
        std::move(b), dtype::bfloat16, "bf16_compress hook");
  };
}

expected<comm_hook> find_comm_hook(std::string_view name) {
  if (name == "allreduce") return allreduce_hook();
  if (name == "fp16_compress") return fp16_compress_hook();
  if (name == "bf16_compress") return bf16_compress_hook();
  return make_error(errc::not_found, "no communication hook named '", name,
                    "'; the built-in hooks are allreduce, bf16_compress, fp16_compress");
}

}  // namespace troupe::training
