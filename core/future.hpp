// future<T> / promise<T>: the one asynchronous result type of troupe.
//
// Contract:
// - A promise is set at most once (set_value / set_error return false after the first).
// - A promise destroyed unset completes its future with errc::broken_promise.
// - A future has one consumer: get(), then(), handle() and on_complete() consume it;
//   wait_for() and is_ready() do not. Using a consumed future yields errc::invalid_argument.
// - Continuations run exactly once, on the thread that completes the promise, or inline in
//   the caller of then() when the result is already there. They run without any troupe
//   lock held. Keep them short; hand heavy work to an executor.
// - An exception thrown by a continuation becomes the next future's error
//   (troupe::exception keeps its error, anything else becomes errc::user_error).
// - Every wait takes a timeout; get() without one uses default_timeout().
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/core/unique_function.hpp>

namespace troupe {

template <class T>
class future;
template <class T>
class promise;

namespace detail {

template <class T>
class future_state {
 public:
  using callback = unique_function<void(expected<T>&&)>;

  // Returns false when a result was set before.
  bool set(expected<T>&& result) {
    callback cb;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (done_) return false;
      done_ = true;
      if (cont_)
        cb = std::move(cont_);
      else
        result_.emplace(std::move(result));
    }
    cv_.notify_all();
    if (cb) cb(std::move(result));
    return true;
  }

  // Runs `cb` with the result now if it is there, else when it is set.
  void attach(callback cb) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!done_) {
      cont_ = std::move(cb);
      return;
    }
    expected<T> r = std::move(*result_);
    result_.reset();
    lk.unlock();
    cb(std::move(r));
  }

  bool wait_for(duration d) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_until(lk, deadline::after(d).time_point(), [&] { return done_; });
  }

  bool ready() {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }

  // Precondition: ready() and no continuation attached.
  expected<T> take() {
    std::lock_guard<std::mutex> lk(mu_);
    expected<T> r = std::move(*result_);
    result_.reset();
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<expected<T>> result_;
  callback cont_;
};

template <class R>
struct unwrap_result {
  using type = R;
};
template <class U>
struct unwrap_result<expected<U>> {
  using type = U;
};
template <class U>
struct unwrap_result<future<U>> {
  using type = U;
};

inline error current_exception_to_error() {
  try {
    throw;
  } catch (const exception& e) {
    return e.err();
  } catch (const std::exception& e) {
    return error(errc::user_error, e.what());
  } catch (...) {
    return error(errc::user_error, "a continuation threw a non-standard exception");
  }
}

inline error consumed_future_error() {
  return error(errc::invalid_argument,
               "this future has no state: it was default-built or already consumed by get(), "
               "then(), handle() or on_complete(); keep the future those calls return");
}

}  // namespace detail

/// The producing side of a future<T>. Move-only.
template <class T>
class promise {
 public:
  /// A promise with a fresh shared state.
  promise() : state_(std::make_shared<detail::future_state<T>>()) {}
  ///@{
  /// Moves the state; a promise assigned over that had no result yet breaks its future
  /// (errc::broken_promise), as its destructor does.
  promise(promise&&) noexcept = default;
  promise& operator=(promise&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ///@}
  promise(const promise&) = delete;
  promise& operator=(const promise&) = delete;
  /// Without a result set, the future gets errc::broken_promise.
  ~promise() { abandon(); }

  /// The future of this promise; call once.
  future<T> get_future();

  /// Sets the result; false if it was set before (the new value is dropped).
  bool set(expected<T> result) { return state_ && state_->set(std::move(result)); }
  /// Sets a value built from `args` (none for future<void>); false if set before.
  template <class... Args>
  bool set_value(Args&&... args) {
    if constexpr (std::is_void_v<T>)
      return set(expected<void>());
    else
      return set(expected<T>(T(std::forward<Args>(args)...)));
  }
  /// Sets the error `e`; false if a result was set before.
  bool set_error(error e) { return set(expected<T>(std::move(e))); }

 private:
  void abandon() {
    if (state_)
      state_->set(
          error(errc::broken_promise, "the producer of this result went away without setting it"));
  }
  std::shared_ptr<detail::future_state<T>> state_;
  bool future_taken_ = false;
};

/// The consuming side. Move-only; see the contract at the top of this file.
template <class T>
class [[nodiscard]] future {
 public:
  /// The type of the result's value.
  using value_type = T;

  /// A future with no state (valid() is false).
  future() = default;
  ///@{
  /// Moves the state; the source is left without one.
  future(future&&) noexcept = default;
  future& operator=(future&&) noexcept = default;
  ///@}
  future(const future&) = delete;
  future& operator=(const future&) = delete;

  /// Whether it has a state: not default-built and not consumed yet.
  bool valid() const noexcept { return state_ != nullptr; }
  /// Whether the result is there (get() would not wait).
  bool is_ready() const { return state_ && state_->ready(); }

  /// Waits up to `d`; true once the result is there. A consumed future returns true
  /// (get() then reports the misuse).
  bool wait_for(duration d) const { return !state_ || state_->wait_for(d); }

  /// The result, waiting up to `timeout`. On timeout returns errc::timeout and the
  /// future stays valid, so the caller may wait again.
  expected<T> get(duration timeout) {
    if (!state_) return detail::consumed_future_error();
    if (!state_->wait_for(timeout))
      return make_error(errc::timeout, "the result was not ready within ",
                        format_duration(timeout));
    auto s = std::move(state_);
    return s->take();
  }
  /// The result, waiting up to the process's default timeout (TROUPE_DEFAULT_TIMEOUT).
  expected<T> get() { return get(default_timeout()); }

  /// Calls `f(expected<T>&&)` with the result; consumes the future.
  template <class F>
  void on_complete(F&& f) {
    auto s = std::move(state_);
    if (!s) {
      f(expected<T>(detail::consumed_future_error()));
      return;
    }
    s->attach(std::forward<F>(f));
  }

  /// Chains `f` on success: `f(T)` (or `f()` for void). `f` may return U, `expected<U>`,
  /// `future<U>` or void; the result is a future of U. Errors skip `f` and pass through.
  template <class F>
  auto then(F&& f) {
    return chain(
        std::forward<F>(f),
        [](auto& fn, expected<T>&& r) {
          if constexpr (std::is_void_v<T>)
            return fn();
          else
            return fn(std::move(*r));
        },
        /*skip_errors=*/std::true_type{});
  }

  /// Chains `f(expected<T>&&)`, called on success and on error (to recover or translate).
  template <class F>
  auto handle(F&& f) {
    return chain(
        std::forward<F>(f), [](auto& fn, expected<T>&& r) { return fn(std::move(r)); },
        /*skip_errors=*/std::false_type{});
  }

 private:
  friend class promise<T>;
  explicit future(std::shared_ptr<detail::future_state<T>> s) : state_(std::move(s)) {}

  template <class U, class R>
  static void complete_with(promise<U>& p, R&& r) {
    using RD = std::decay_t<R>;
    if constexpr (std::is_same_v<RD, future<U>>) {
      r.on_complete([p = std::move(p)](expected<U>&& inner) mutable { p.set(std::move(inner)); });
    } else {
      p.set(expected<U>(std::forward<R>(r)));
    }
  }

  template <class F, class Invoke, class Skip>
  auto chain(F&& f, Invoke invoke, Skip) {
    using R = decltype(invoke(std::declval<std::decay_t<F>&>(), std::declval<expected<T>&&>()));
    using U = typename detail::unwrap_result<R>::type;
    promise<U> p;
    future<U> next = p.get_future();
    on_complete([p = std::move(p), fn = std::forward<F>(f), invoke](expected<T>&& r) mutable {
      if constexpr (Skip::value) {
        if (!r) {
          p.set_error(std::move(r).error());
          return;
        }
      }
      try {
        if constexpr (std::is_void_v<R>) {
          invoke(fn, std::move(r));
          p.set_value();
        } else {
          complete_with(p, invoke(fn, std::move(r)));
        }
      } catch (...) {
        p.set_error(detail::current_exception_to_error());
      }
    });
    return next;
  }

  std::shared_ptr<detail::future_state<T>> state_;
};

template <class T>
future<T> promise<T>::get_future() {
  if (future_taken_ || !state_) return future<T>();
  future_taken_ = true;
  return future<T>(state_);
}

/// A future that is already complete.
template <class T>
future<T> make_ready_future(T value) {
  promise<T> p;
  auto f = p.get_future();
  p.set_value(std::move(value));
  return f;
}
inline future<void> make_ready_future() {
  promise<void> p;
  auto f = p.get_future();
  p.set_value();
  return f;
}
template <class T>
future<T> make_error_future(error e) {
  promise<T> p;
  auto f = p.get_future();
  p.set_error(std::move(e));
  return f;
}

/// Completes with all values in order once every future has succeeded, or with the first
/// error as soon as one arrives (the other results are then dropped when they come).
template <class T>
auto when_all(std::vector<future<T>> futures) {
  using out_t = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  using slot_t = std::conditional_t<std::is_void_v<T>, char, T>;
  struct gather {
    std::mutex mu;
    std::size_t left = 0;
    std::vector<std::optional<slot_t>> values;
    promise<out_t> p;
  };
  auto g = std::make_shared<gather>();
  g->left = futures.size();
  g->values.resize(futures.size());
  auto result = g->p.get_future();
  auto finish = [](gather& st) {
    if constexpr (std::is_void_v<T>) {
      st.p.set_value();
    } else {
      std::vector<T> out;
      out.reserve(st.values.size());
      for (auto& v : st.values) out.push_back(std::move(*v));
      st.p.set_value(std::move(out));
    }
  };
  if (futures.empty()) {
    finish(*g);
    return result;
  }
  for (std::size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_complete([g, i, finish](expected<T>&& r) {
      if (!r) {
        g->p.set_error(std::move(r).error());  // first error wins; later sets are no-ops
        return;
      }
      bool last = false;
      {
        std::lock_guard<std::mutex> lk(g->mu);
        if constexpr (std::is_void_v<T>)
          g->values[i].emplace('\0');
        else
          g->values[i].emplace(std::move(*r));
        last = --g->left == 0;
      }
      if (last) finish(*g);
    });
  }
  return result;
}

}  // namespace troupe
