// unique_function<R(A...)>: a move-only std::function, so callbacks may own promises,
// buffers and sockets. A callable of up to inline_bytes that moves without throwing is kept
// inside the object, without an allocation: a continuation or an operation's body made on
// every call would otherwise cost a malloc and a free each.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace troupe {

template <class Signature>
class unique_function;

/// A move-only callable with signature R(Args...); empty until given a callable.
template <class R, class... Args>
class unique_function<R(Args...)> {
 public:
  /// Callables up to this size (and alignment of std::max_align_t) that move without
  /// throwing live inside the object; larger ones on the heap.
  static constexpr std::size_t inline_bytes = 64;

  ///@{
  /// An empty function (operator bool is false; calling it is undefined).
  unique_function() = default;
  unique_function(std::nullptr_t) {}
  ///@}
  /// Owns the callable `f` (moved or copied in).
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, unique_function> &&
           std::is_invocable_r_v<R, std::decay_t<F>&, Args...>) unique_function(F&& f) {
    using D = std::decay_t<F>;
    if constexpr (fits_inline<D>) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      ops_ = &inline_ops<D>;
    } else {
      ::new (static_cast<void*>(buf_)) D*(new D(std::forward<F>(f)));
      ops_ = &heap_ops<D>;
    }
  }

  ///@{
  /// Moves the callable; the source is left empty.
  unique_function(unique_function&& other) noexcept { take(other); }
  unique_function& operator=(unique_function&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  ///@}
  unique_function(const unique_function&) = delete;
  unique_function& operator=(const unique_function&) = delete;
  ~unique_function() { reset(); }

  /// Whether it holds a callable.
  explicit operator bool() const noexcept { return ops_ != nullptr; }
  /// Calls the callable; only when it holds one.
  R operator()(Args... args) { return ops_->call(buf_, std::forward<Args>(args)...); }

 private:
  struct ops_t {
    R (*call)(void* self, Args&&... args);
    void (*move)(void* to, void* from) noexcept;  // leaves `from` destroyed
    void (*destroy)(void* self) noexcept;
  };
  template <class D>
  static constexpr bool fits_inline =
      sizeof(D) <= inline_bytes &&
      alignof(D) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<D>;
  template <class D>
  static D& held(void* p) noexcept {
    return *std::launder(static_cast<D*>(p));
  }
  template <class D>
  static constexpr ops_t inline_ops{
      [](void* self, Args&&... args) -> R { return held<D>(self)(std::forward<Args>(args)...); },
      [](void* to, void* from) noexcept {
        ::new (to) D(std::move(held<D>(from)));
        held<D>(from).~D();
      },
      [](void* self) noexcept { held<D>(self).~D(); }};
  template <class D>
  static constexpr ops_t heap_ops{
      [](void* self, Args&&... args) -> R {
        return (*held<D*>(self))(std::forward<Args>(args)...);
      },
      [](void* to, void* from) noexcept { ::new (to) D*(held<D*>(from)); },
      [](void* self) noexcept { delete held<D*>(self); }};

  void take(unique_function& other) noexcept {
    if (!other.ops_) return;
    other.ops_->move(buf_, other.buf_);
    ops_ = other.ops_;
    other.ops_ = nullptr;
  }
  void reset() noexcept {
    if (!ops_) return;
    ops_->destroy(buf_);
    ops_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buf_[inline_bytes];
  const ops_t* ops_ = nullptr;
};

}  // namespace troupe
