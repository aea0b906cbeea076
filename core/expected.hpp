// expected<T>: a value or a troupe::error. The return type of every fallible call.
#pragma once

#include <type_traits>
#include <utility>
#include <variant>

#include <troupe/core/error.hpp>

namespace troupe {

/// Holds either a T or an error. Implicitly built from either; `value()` throws
/// `troupe::exception` when it holds an error, `*` and `->` do not check.
template <class T>
class [[nodiscard]] expected {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, troupe::error>,
                "expected<error> is ambiguous");

 public:
  /// The type held on success.
  using value_type = T;

  /// A default-constructed T.
  expected() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  ///@{
  /// Holds `v` (implicit, so a function returning expected<T> can `return v;`).
  expected(const T& v) : v_(std::in_place_index<0>, v) {}
  expected(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}
  ///@}
  /// Holds a T built from `v`.
  template <class U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, troupe::error> &&
           !std::is_same_v<std::decay_t<U>, expected>) expected(U&& v)
      : v_(std::in_place_index<0>, std::forward<U>(v)) {}
  /// Holds the error `e` (implicit, so `return make_error(...);` works).
  expected(troupe::error e) : v_(std::in_place_index<1>, std::move(e)) {}

  /// Whether it holds a value (not an error).
  bool has_value() const noexcept { return v_.index() == 0; }
  /// Same as has_value().
  explicit operator bool() const noexcept { return has_value(); }

  ///@{
  /// The value; throws troupe::exception carrying the error when it holds one.
  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::get<0>(std::move(v_));
  }
  ///@}
  /// The value, or `fallback` converted to T when it holds an error.
  template <class U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(v_) : static_cast<T>(std::forward<U>(fallback));
  }

  ///@{
  /// The value, unchecked: only after has_value() said yes.
  T& operator*() & noexcept { return *std::get_if<0>(&v_); }
  const T& operator*() const& noexcept { return *std::get_if<0>(&v_); }
  T&& operator*() && noexcept { return std::move(*std::get_if<0>(&v_)); }
  T* operator->() noexcept { return std::get_if<0>(&v_); }
  const T* operator->() const noexcept { return std::get_if<0>(&v_); }
  ///@}

  ///@{
  /// The error, unchecked: only after has_value() said no.
  const troupe::error& error() const& noexcept { return *std::get_if<1>(&v_); }
  troupe::error& error() & noexcept { return *std::get_if<1>(&v_); }
  troupe::error&& error() && noexcept { return std::move(*std::get_if<1>(&v_)); }
  ///@}

 private:
  void check() const {
    if (!has_value()) throw exception(std::get<1>(v_));
  }
  std::variant<T, troupe::error> v_;
};

/// expected<void>: success or an error.
template <>
class [[nodiscard]] expected<void> {
 public:
  /// Nothing is held on success.
  using value_type = void;

  /// Success (also ok()).
  expected() = default;
  /// Holds the error `e`.
  expected(troupe::error e) : err_(std::move(e)), ok_(false) {}

  /// Whether it is a success.
  bool has_value() const noexcept { return ok_; }
  /// Same as has_value().
  explicit operator bool() const noexcept { return ok_; }
  /// Throws troupe::exception carrying the error when it holds one.
  void value() const {
    if (!ok_) throw exception(err_);
  }
  ///@{
  /// The error, unchecked: only after has_value() said no.
  const troupe::error& error() const& noexcept { return err_; }
  troupe::error& error() & noexcept { return err_; }
  troupe::error&& error() && noexcept { return std::move(err_); }
  ///@}

 private:
  troupe::error err_;
  bool ok_ = true;
};

/// Success value for expected<void>.
inline expected<void> ok() { return {}; }

/// Returns from the enclosing function with the error of `expr` if it holds one.
#define TROUPE_TRY(expr)                                       \
  do {                                                         \
    if (auto troupe_try_result_ = (expr); !troupe_try_result_) \
      return std::move(troupe_try_result_).error();            \
  } while (false)

}  // namespace troupe
