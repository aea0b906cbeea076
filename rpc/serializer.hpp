// binary_serializer / binary_deserializer: the byte form of sendable values (see
// rpc/inspect.hpp for how a type becomes sendable). Little-endian hosts only.
//
// Encoding: arithmetic values and enums in their native little-endian bytes; bool as one
// byte; strings, vectors, maps as a u32 count then the elements; std::array and tuples
// element by element; optional as a u8 flag then the value; tensors as a u32 index into
// the frame's tensor list (their bytes travel outside the serialized arguments).
// The deserializer never reads past its input and refuses counts larger than the bytes
// left, so hostile input fails with errc::protocol_error instead of allocating.
#pragma once

#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/device.hpp>
#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/tensor.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/inspect.hpp>

static_assert(std::endian::native == std::endian::little,
              "troupe's RPC encoding assumes a little-endian host");

namespace troupe::rpc {

namespace detail {

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_std_array : std::false_type {};
template <class T, std::size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T>
concept map_like = requires {
  typename T::key_type;
  typename T::mapped_type;
}
&&requires(T& m) {
  m.emplace(std::declval<typename T::key_type>(), std::declval<typename T::mapped_type>());
};
template <class T>
inline constexpr bool is_raw_v = std::is_arithmetic_v<T> || std::is_enum_v<T>;

template <class F, class T>
concept has_inspect = requires(F& f, T& x) {
  inspect(f, x);
};

}  // namespace detail

/// Writes values to a byte buffer; tensors go to a side list.
class binary_serializer {
 public:
  using result_type = inspect_error;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = false;

  explicit binary_serializer(bytes& out, std::vector<tensor>* tensors = nullptr,
                             inspect_context* ctx = nullptr)
      : out_(out), tensors_(tensors), ctx_(ctx) {}

  inspect_context* context() const noexcept { return ctx_; }

  template <class... Ts>
  result_type operator()(Ts&&... xs) {
    result_type r;
    ((r ? void() : void(r = apply(xs))), ...);
    return r;
  }

  /// Raw bytes, for inspect overloads that write their own layout.
  void write_raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }

 private:
  void put_count(std::size_t n) {
    auto c = static_cast<std::uint32_t>(n);
    write_raw(&c, sizeof c);
  }

  template <class T>
  result_type apply(const T& x) {
    using U = std::remove_cvref_t<T>;
    if constexpr (is_annotation_v<U>) {
      return {};
    } else if constexpr (std::is_same_v<U, bool>) {
      std::uint8_t b = x ? 1 : 0;
      write_raw(&b, 1);
      return {};
    } else if constexpr (detail::is_raw_v<U>) {
      write_raw(&x, sizeof(U));
      return {};
    } else if constexpr (std::is_same_v<U, std::string>) {
      put_count(x.size());
      write_raw(x.data(), x.size());
      return {};
    } else if constexpr (detail::is_vector<U>::value) {
      using E = typename U::value_type;
      if (x.size() > 0xffffffffu)
        return result_type(error(errc::invalid_argument, "a vector of more than 2^32 elements"));
      put_count(x.size());
      if constexpr (detail::is_raw_v<E> && !std::is_same_v<E, bool>) {
        write_raw(x.data(), x.size() * sizeof(E));
      } else {
        for (const auto& e : x)
          if (auto r = apply(e)) return r;
      }
      return {};
    } else if constexpr (detail::is_std_array<U>::value) {
      for (const auto& e : x)
        if (auto r = apply(e)) return r;
      return {};
    } else if constexpr (detail::is_optional<U>::value) {
      std::uint8_t has = x.has_value() ? 1 : 0;
      write_raw(&has, 1);
      if (x) return apply(*x);
      return {};
    } else if constexpr (detail::is_tuple_like<U>::value) {
      return std::apply([this](const auto&... es) { return (*this)(es...); }, x);
    } else if constexpr (detail::map_like<U>) {
      put_count(x.size());
      for (const auto& [k, v] : x) {
        if (auto r = apply(k)) return r;
        if (auto r = apply(v)) return r;
      }
      return {};
    } else if constexpr (std::is_same_v<U, device>) {
      std::uint8_t t = static_cast<std::uint8_t>(x.type());
      std::int32_t i = x.index();
      write_raw(&t, 1);
      write_raw(&i, 4);
      return {};
    } else if constexpr (std::is_same_v<U, worker_info>) {
      return (*this)(x.name, x.id);
    } else if constexpr (std::is_same_v<U, error>) {
      std::uint8_t c = static_cast<std::uint8_t>(x.code());
      write_raw(&c, 1);
      return (*this)(x.message(), x.worker(), x.operation());
    } else if constexpr (std::is_same_v<U, tensor>) {
      if (!tensors_)
        return result_type(error(errc::unsupported,
                                 "a tensor cannot be serialized here: only RPC arguments and "
                                 "results carry tensors"));
      std::uint32_t idx = static_cast<std::uint32_t>(tensors_->size());
      tensors_->push_back(x);
      write_raw(&idx, 4);
      return {};
    } else {
      static_assert(detail::has_inspect<binary_serializer, U>,
                    "this type is not sendable: give it an `inspect(Inspector&, T&)` overload "
                    "next to it (see docs/rpc.md, 'Making a type sendable')");
      return inspect(*this, const_cast<U&>(x));
    }
  }

  bytes& out_;
  std::vector<tensor>* tensors_;
  inspect_context* ctx_;
};

/// Reads values written by binary_serializer; tensors come from a side list.
class binary_deserializer {
 public:
  using result_type = inspect_error;
  static constexpr bool reads_state = false;
  static constexpr bool writes_state = true;

  explicit binary_deserializer(std::span<const std::byte> in,
                               std::vector<tensor>* tensors = nullptr,
                               inspect_context* ctx = nullptr)
      : in_(in), tensors_(tensors), ctx_(ctx) {}

  inspect_context* context() const noexcept { return ctx_; }
  std::size_t remaining() const noexcept { return in_.size() - pos_; }

  template <class... Ts>
  result_type operator()(Ts&&... xs) {
    result_type r;
    ((r ? void() : void(r = apply(xs))), ...);
    return r;
  }

  /// Reads `n` raw bytes; fails when fewer are left.
  result_type read_raw(void* p, std::size_t n, const char* what) {
    if (remaining() < n)
      return result_type(make_error(errc::protocol_error, "truncated input while reading ", what,
                                    ": need ", n, " bytes, ", remaining(), " left"));
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return {};
  }

 private:
  result_type get_count(std::size_t& n, std::size_t min_elem, const char* what) {
    std::uint32_t c = 0;
    if (auto r = read_raw(&c, 4, what)) return r;
    if (min_elem > 0 && c > remaining() / min_elem)
      return result_type(make_error(errc::protocol_error, "a ", what, " claims ", c,
                                    " elements but only ", remaining(), " bytes are left"));
    n = c;
    return {};
  }

  template <class T>
  result_type apply(T& x) {
    using U = std::remove_cvref_t<T>;
    if constexpr (is_annotation_v<U>) {
      return {};
    } else if constexpr (std::is_const_v<std::remove_reference_t<T>>) {
      static_assert(!sizeof(U*), "cannot deserialize into a const object");
      return {};
    } else if constexpr (std::is_same_v<U, bool>) {
      std::uint8_t b = 0;
      if (auto r = read_raw(&b, 1, "bool")) return r;
      if (b > 1) return result_type(make_error(errc::protocol_error, "a bool holds ", int(b)));
      x = b == 1;
      return {};
    } else if constexpr (detail::is_raw_v<U>) {
      return read_raw(&x, sizeof(U), "a number");
    } else if constexpr (std::is_same_v<U, std::string>) {
      std::size_t n = 0;
      if (auto r = get_count(n, 1, "string")) return r;
      x.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
      pos_ += n;
      return {};
    } else if constexpr (detail::is_vector<U>::value) {
      using E = typename U::value_type;
      std::size_t n = 0;
      if constexpr (detail::is_raw_v<E> && !std::is_same_v<E, bool>) {
        if (auto r = get_count(n, sizeof(E), "vector")) return r;
        x.resize(n);
        return read_raw(x.data(), n * sizeof(E), "vector elements");
      } else {
        if (auto r = get_count(n, 1, "vector")) return r;
        x.clear();
        x.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
          E e{};
          if (auto r = apply(e)) return r;
          x.push_back(std::move(e));
        }
        return {};
      }
    } else if constexpr (detail::is_std_array<U>::value) {
      for (auto& e : x)
        if (auto r = apply(e)) return r;
      return {};
    } else if constexpr (detail::is_optional<U>::value) {
      std::uint8_t has = 0;
      if (auto r = read_raw(&has, 1, "optional flag")) return r;
      if (has > 1)
        return result_type(make_error(errc::protocol_error, "an optional flag holds ", int(has)));
      if (has == 0) {
        x.reset();
        return {};
      }
      typename U::value_type v{};
      if (auto r = apply(v)) return r;
      x = std::move(v);
      return {};
    } else if constexpr (detail::is_tuple_like<U>::value) {
      return std::apply([this](auto&... es) { return (*this)(es...); }, x);
    } else if constexpr (detail::map_like<U>) {
      std::size_t n = 0;
      if (auto r = get_count(n, 1, "map")) return r;
      x.clear();
      for (std::size_t i = 0; i < n; ++i) {
        typename U::key_type k{};
        typename U::mapped_type v{};
        if (auto r = apply(k)) return r;
        if (auto r = apply(v)) return r;
        x.emplace(std::move(k), std::move(v));
      }
      return {};
    } else if constexpr (std::is_same_v<U, device>) {
      std::uint8_t t = 0;
      std::int32_t i = 0;
      if (auto r = read_raw(&t, 1, "device type")) return r;
      if (auto r = read_raw(&i, 4, "device index")) return r;
      if (t == 0) {
        x = device::cpu();
        return {};
      }
      if (t != 1)
        return result_type(make_error(errc::protocol_error, "unknown device type ", int(t)));
      auto d = device::cuda(i);
      if (!d) return result_type(make_error(errc::protocol_error, "bad cuda index ", i));
      x = *d;
      return {};
    } else if constexpr (std::is_same_v<U, worker_info>) {
      return (*this)(x.name, x.id);
    } else if constexpr (std::is_same_v<U, error>) {
      std::uint8_t c = 0;
      std::string msg, w, op;
      if (auto r = (*this)(c, msg, w, op)) return r;
      errc code = errc::internal;
      if (c >= static_cast<std::uint8_t>(errc::timeout) &&
          c <= static_cast<std::uint8_t>(errc::membership_changed))
        code = static_cast<errc>(c);
      x = error(code, std::move(msg));
      if (!w.empty()) x.with_worker(std::move(w));
      if (!op.empty()) x.with_operation(std::move(op));
      return {};
    } else if constexpr (std::is_same_v<U, tensor>) {
      std::uint32_t idx = 0;
      if (auto r = read_raw(&idx, 4, "tensor index")) return r;
      if (!tensors_ || idx >= tensors_->size())
        return result_type(make_error(errc::protocol_error, "tensor index ", idx,
                                      " but the frame carries ", tensors_ ? tensors_->size() : 0,
                                      " tensors"));
      x = (*tensors_)[idx];
      return {};
    } else {
      static_assert(detail::has_inspect<binary_deserializer, U>,
                    "this type is not sendable: give it an `inspect(Inspector&, T&)` overload "
                    "next to it (see docs/rpc.md, 'Making a type sendable')");
      return inspect(*this, x);
    }
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::vector<tensor>* tensors_;
  inspect_context* ctx_;
};

/// Appends the byte form of `xs` to `out`.
template <class... Ts>
expected<void> serialize(bytes& out, std::vector<tensor>* tensors, const Ts&... xs) {
  binary_serializer f(out, tensors);
  if (auto r = f(xs...)) return r.err();
  return ok();
}

/// Reads `xs` from `in`, which must hold exactly them; `ctx` (may be null) is what the
/// inspectors reach through context(), the agent for remote references.
template <class... Ts>
expected<void> deserialize_with(inspect_context* ctx, std::span<const std::byte> in,
                                std::vector<tensor>* tensors, Ts&... xs) {
  binary_deserializer f(in, tensors, ctx);
  if (auto r = f(xs...)) return r.err();
  if (f.remaining() != 0)
    return make_error(errc::protocol_error, f.remaining(), " bytes left over after the last value");
  return ok();
}

/// Reads `xs` from `in`, which must hold exactly them.
template <class... Ts>
expected<void> deserialize(std::span<const std::byte> in, std::vector<tensor>* tensors, Ts&... xs) {
  binary_deserializer f(in, tensors);
  if (auto r = f(xs...)) return r.err();
  if (f.remaining() != 0)
    return make_error(errc::protocol_error, f.remaining(), " bytes left over after the last value");
  return ok();
}

}  // namespace troupe::rpc
