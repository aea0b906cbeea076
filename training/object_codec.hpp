// object_codec<T>: how broadcast_object turns a value into bytes and back. Provided for
// arithmetic types, std::string, troupe::bytes and std::vector of any of these;
// specialize it for your own types:
//
//   template <> struct troupe::training::object_codec<my_config> {
//     static void encode(byte_writer& w, const my_config& c) { w.str(c.name); w.u32(c.n); }
//     static expected<my_config> decode(byte_reader& r) { ... }
//   };
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <troupe/core/codec.hpp>

namespace troupe::training {

template <class T, class = void>
struct object_codec;

template <class T>
struct object_codec<T, std::enable_if_t<std::is_arithmetic_v<T>>> {
  static void encode(byte_writer& w, const T& v) { w.raw(&v, sizeof v); }
  static expected<T> decode(byte_reader& r) {
    T v{};
    auto* out = reinterpret_cast<std::uint8_t*>(&v);
    for (std::size_t i = 0; i < sizeof v; ++i) {
      auto b = r.u8("arithmetic value");
      if (!b) return std::move(b).error();
      out[i] = *b;
    }
    return v;
  }
};

template <>
struct object_codec<std::string> {
  static void encode(byte_writer& w, const std::string& s) { w.str(s); }
  static expected<std::string> decode(byte_reader& r) { return r.str("string"); }
};

template <>
struct object_codec<bytes> {
  static void encode(byte_writer& w, const bytes& b) { w.blob(b); }
  static expected<bytes> decode(byte_reader& r) { return r.blob("bytes"); }
};

template <class T>
struct object_codec<std::vector<T>, std::enable_if_t<!std::is_same_v<T, std::byte>>> {
  static void encode(byte_writer& w, const std::vector<T>& v) {
    w.u64(v.size());
    if constexpr (std::is_arithmetic_v<T>)
      w.raw(v.data(), v.size() * sizeof(T));
    else
      for (auto& x : v) object_codec<T>::encode(w, x);
  }
  static expected<std::vector<T>> decode(byte_reader& r) {
    auto n = r.u64("vector length");
    if (!n) return std::move(n).error();
    if (*n > r.remaining())
      return make_error(errc::protocol_error, "vector length ", *n, " exceeds the ", r.remaining(),
                        " bytes left");
    std::vector<T> v;
    v.reserve(*n);
    for (std::uint64_t i = 0; i < *n; ++i) {
      auto x = object_codec<T>::decode(r);
      if (!x) return std::move(x).error();
      v.push_back(std::move(*x));
    }
    return v;
  }
};

}  // namespace troupe::training
