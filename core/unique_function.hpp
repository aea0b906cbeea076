// unique_function<R(A...)>: a move-only std::function, so callbacks may own promises,
// buffers and sockets.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace troupe {

template <class Signature>
class unique_function;

/// A move-only callable with signature R(Args...); empty until given a callable.
template <class R, class... Args>
class unique_function<R(Args...)> {
 public:
  ///@{
  /// An empty function (operator bool is false; calling it is undefined).
  unique_function() = default;
  unique_function(std::nullptr_t) {}
  ///@}
  /// Owns the callable `f` (moved or copied in).
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, unique_function> &&
           std::is_invocable_r_v<R, std::decay_t<F>&, Args...>) unique_function(F&& f)
      : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}

  ///@{
  /// Moves the callable; the source is left empty.
  unique_function(unique_function&&) noexcept = default;
  unique_function& operator=(unique_function&&) noexcept = default;
  ///@}

  /// Whether it holds a callable.
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// Calls the callable; only when it holds one.
  R operator()(Args... args) { return impl_->call(std::forward<Args>(args)...); }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual R call(Args... args) = 0;
  };
  template <class F>
  struct model final : concept_t {
    explicit model(F&& fn) : f(std::move(fn)) {}
    explicit model(const F& fn) : f(fn) {}
    R call(Args... args) override { return f(std::forward<Args>(args)...); }
    F f;
  };
  std::unique_ptr<concept_t> impl_;
};

}  // namespace troupe
