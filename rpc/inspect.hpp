// The one way to make a type sendable in troupe: an `inspect` overload found by ADL,
// written once and shared by RPC and the actors layer (CAF 0.17 calls the same function):
//
//   struct point { int x; int y; std::string label; };
//   template <class Inspector>
//   typename Inspector::result_type inspect(Inspector& f, point& p) {
//     return f(troupe::rpc::meta::type_name("point"), p.x, p.y, p.label);
//   }
//
// An inspector is called with the fields in order, optionally preceded by annotations.
// Annotations describe, they carry no data: our binary inspectors skip every argument for
// which `is_annotation<T>` holds. CAF's annotations (`caf::meta::type_name` and friends,
// which derive from caf::meta::annotation) are recognized once the actors layer's bridge
// header specializes the hook below, so rpc/ never includes CAF:
//
//   template <class T>
//   struct troupe::rpc::is_annotation<
//       T, std::enable_if_t<std::is_base_of_v<caf::meta::annotation, T>>> : std::true_type {};
//
// `result_type` behaves like caf::error: it converts to true when inspection failed, so
// `if (auto err = f(x.a)) return err;` means the same in both worlds.
#pragma once

#include <type_traits>
#include <utility>

#include <troupe/core/error.hpp>

namespace troupe::rpc {

/// Base of troupe's own inspector annotations.
struct annotation {};

/// Hook: true for types an inspector must skip (annotations). Specialize it, with the
/// second parameter as an enable_if, for annotation families defined elsewhere.
template <class T, class = void>
struct is_annotation : std::is_base_of<annotation, T> {};

template <class T>
inline constexpr bool is_annotation_v = is_annotation<std::remove_cvref_t<T>>::value;

namespace meta {

/// Names the type for readers and error messages; no bytes on the wire.
struct type_name : annotation {
  constexpr explicit type_name(const char* n) : value(n) {}
  const char* value;
};

}  // namespace meta

/// The result of an inspector call: false (no error) or the error that stopped it.
class inspect_error {
 public:
  inspect_error() = default;
  explicit inspect_error(error e) : err_(std::move(e)), failed_(true) {}
  /// True when inspection failed (as caf::error converts to true when set).
  explicit operator bool() const noexcept { return failed_; }
  const error& err() const noexcept { return err_; }

 private:
  error err_;
  bool failed_ = false;
};

/// Extension point for what an inspector needs beyond the bytes (the agent that owns
/// remote references, say). Inspectors return it from `context()`; may be null.
class inspect_context {
 public:
  virtual ~inspect_context() = default;
};

}  // namespace troupe::rpc
