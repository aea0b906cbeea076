#include <troupe/training/flat_views.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace troupe::training {

expected<flat_views> flat_views::make(std::vector<tensor_view> parts) {
  flat_views f;
  std::size_t total = 0;
  for (auto& p : parts) {
    if (p.type != parts.front().type || p.where != parts.front().where)
      return make_error(errc::invalid_argument,
                        "flat_views: tensors of different dtypes or devices in one buffer");
    total += p.numel;
  }
  f.parts_ = std::move(parts);
  if (f.parts_.empty()) return f;
  const auto& first = f.parts_.front();
  // Contiguous in some order: sorted by address, each part starts where the last ended.
  std::vector<const tensor_view*> by_address;
  for (auto& p : f.parts_)
    if (p.numel > 0) by_address.push_back(&p);
  std::sort(by_address.begin(), by_address.end(),
            [](auto* a, auto* b) { return std::less<>()(a->data, b->data); });
  bool contiguous = !by_address.empty();
  for (std::size_t i = 1; i < by_address.size() && contiguous; ++i)
    contiguous = static_cast<std::byte*>(by_address[i - 1]->data) + by_address[i - 1]->nbytes() ==
                 by_address[i]->data;
  if (contiguous) {
    f.in_place_ = true;
    f.view_ = {by_address.front()->data, first.type, total, first.where};
    return f;
  }
  if (!first.where.is_cpu())
    return make_error(errc::unsupported, "gradients on ", first.where.to_string(),
                      " that are not one contiguous allocation cannot be bucketed; place "
                      "them back to back in one buffer");
  f.copy_.resize(total * element_size(first.type));
  f.view_ = {f.copy_.data(), first.type, total, first.where};
  return f;
}

void flat_views::pack() {
  if (in_place_) return;
  std::byte* out = static_cast<std::byte*>(view_.data);
  for (auto& p : parts_) {
    if (p.numel) std::memcpy(out, p.data, p.nbytes());
    out += p.nbytes();
  }
}

void flat_views::unpack() {
  if (in_place_) return;
  const std::byte* in = static_cast<const std::byte*>(view_.data);
  for (auto& p : parts_) {
    if (p.numel) std::memcpy(p.data, in, p.nbytes());
    in += p.nbytes();
  }
}

void fill_zero(const tensor_view& t) {
  if (t.numel) std::memset(t.data, 0, t.nbytes());
}

namespace {
template <class T>
void scale_as(const tensor_view& t, double factor) {
  auto* p = static_cast<T*>(t.data);
  const T f = static_cast<T>(factor);
  for (std::size_t i = 0; i < t.numel; ++i) p[i] *= f;
}
template <std::uint16_t (*to)(float), float (*from)(std::uint16_t)>
void scale_16(const tensor_view& t, double factor) {
  auto* p = static_cast<std::uint16_t*>(t.data);
  for (std::size_t i = 0; i < t.numel; ++i) p[i] = to(static_cast<float>(from(p[i]) * factor));
}
}  // namespace

expected<void> scale(const tensor_view& t, double factor) {
  if (!t.where.is_cpu())
    return make_error(errc::unsupported, "scaling a tensor on ", t.where.to_string(),
                      " is not supported by the host-side helpers");
  switch (t.type) {
    case dtype::float32:
      scale_as<float>(t, factor);
      return ok();
    case dtype::float64:
      scale_as<double>(t, factor);
      return ok();
    case dtype::float16:
      scale_16<collectives::float_to_half, collectives::half_to_float>(t, factor);
      return ok();
    case dtype::bfloat16:
      scale_16<collectives::float_to_bfloat16, collectives::bfloat16_to_float>(t, factor);
      return ok();
    default:
      return make_error(errc::unsupported, "cannot scale a ", to_string(t.type), " tensor");
  }
}

}  // namespace troupe::training
