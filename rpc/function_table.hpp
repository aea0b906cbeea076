// function_table: the functions a worker serves, by name, with typed arguments and
// results. A function is any callable; its parameter and result types must be sendable
// (rpc/inspect.hpp). It may take `const call_info&` first to learn who called, and may
// return T, expected<T>, or void. An exception it throws reaches the caller as
// errc::user_error carrying the exception's text and this worker's name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/serializer.hpp>

namespace troupe::rpc {

/// What a function may learn about its call.
struct call_info {
  worker_info caller;
  std::string function;
  /// The request id the caller gave the call (its call_options::request_id; `call` in
  /// the trace).
  std::uint64_t call = 0;
};

/// Where a function runs.
struct function_options {
  /// Run on the I/O thread that received the call instead of the worker pool. Only for
  /// short, non-blocking functions: it saves two thread switches per call but stalls
  /// every connection of that I/O thread while it runs.
  bool run_inline = false;
};

/// Inside a function registered with run_inline: runs `fn` on this I/O thread once every
/// frame of the current read from the socket has been handled (a stream of small calls
/// arrives many to a read). Lets an inline function collect work and do it once per
/// batch. Returns false and does nothing when called anywhere else.
bool at_end_of_read_batch(std::function<void()> fn);

/// One incoming call as the type-erased handler sees it.
struct incoming_call {
  const call_info* info = nullptr;
  std::span<const std::byte> args;
  std::vector<tensor>* arg_tensors = nullptr;
  bytes* result = nullptr;
  std::vector<tensor>* result_tensors = nullptr;
  inspect_context* context = nullptr;
};

namespace detail {

template <class F>
struct fn_traits : fn_traits<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...) const> {
  using result = R;
  using args = std::tuple<A...>;
};
template <class C, class R, class... A>
struct fn_traits<R (C::*)(A...)> : fn_traits<R (C::*)(A...) const> {};
template <class R, class... A>
struct fn_traits<R (*)(A...)> {
  using result = R;
  using args = std::tuple<A...>;
};
template <class R, class... A>
struct fn_traits<R(A...)> : fn_traits<R (*)(A...)> {};

template <class T>
struct is_expected : std::false_type {};
template <class T>
struct is_expected<expected<T>> : std::true_type {};

template <class Tuple>
struct takes_call_info : std::false_type {};
template <class First, class... Rest>
struct takes_call_info<std::tuple<First, Rest...>>
    : std::is_same<std::remove_cvref_t<First>, call_info> {};

template <class Tuple>
struct drop_first {
  using type = Tuple;
};
template <class First, class... Rest>
struct drop_first<std::tuple<First, Rest...>> {
  using type = std::tuple<Rest...>;
};

template <class Tuple>
struct decay_tuple;
template <class... A>
struct decay_tuple<std::tuple<A...>> {
  using type = std::tuple<std::remove_cvref_t<A>...>;
};

template <class R>
expected<void> write_result(R&& r, const incoming_call& c) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_expected<U>::value) {
    if (!r) return std::move(r).error();
    if constexpr (std::is_void_v<typename U::value_type>)
      return ok();
    else
      return write_result(std::move(*r), c);
  } else {
    binary_serializer f(*c.result, c.result_tensors, c.context);
    if (auto e = f(r)) return e.err();
    return ok();
  }
}

}  // namespace detail

class function_table {
 public:
  using handler = std::function<expected<void>(const incoming_call&)>;
  struct entry {
    std::string name;
    handler fn;
    function_options options;
  };

  /// Registers `f` under `name`. A name already registered is errc::already_exists.
  template <class F>
  expected<void> add(std::string name, F f, function_options options = {});

  /// Registers a type-erased handler (what add() builds).
  expected<void> add_raw(std::string name, handler h, function_options options = {});

  /// The function called `name`, or null.
  std::shared_ptr<const entry> find(std::string_view name) const;
  /// Registered names, sorted.
  std::vector<std::string> names() const;

 private:
  mutable std::shared_mutex mu_;
  std::map<std::string, std::shared_ptr<const entry>, std::less<>> entries_;
};

template <class F>
expected<void> function_table::add(std::string name, F f, function_options options) {
  using traits = detail::fn_traits<std::remove_cvref_t<F>>;
  using all_args = typename traits::args;
  constexpr bool with_info = detail::takes_call_info<all_args>::value;
  using user_args =
      std::conditional_t<with_info, typename detail::drop_first<all_args>::type, all_args>;
  using values = typename detail::decay_tuple<user_args>::type;
  using R = typename traits::result;
  handler h = [fn = std::move(f)](const incoming_call& c) mutable -> expected<void> {
    values args{};
    binary_deserializer d(c.args, c.arg_tensors, c.context);
    inspect_error err = std::apply([&d](auto&... xs) { return d(xs...); }, args);
    if (err)
      return make_error(errc::invalid_argument, "the arguments of '", c.info->function,
                        "' do not match its parameters: ", err.err().message(),
                        "; caller and callee must agree on the argument types");
    if (d.remaining() != 0)
      return make_error(errc::invalid_argument, "'", c.info->function, "' got ", d.remaining(),
                        " bytes of extra arguments; check the number of arguments");
    auto invoke = [&]() -> decltype(auto) {
      if constexpr (with_info)
        return std::apply([&](auto&... xs) -> decltype(auto) { return fn(*c.info, xs...); }, args);
      else
        return std::apply([&](auto&... xs) -> decltype(auto) { return fn(xs...); }, args);
    };
    if constexpr (std::is_void_v<R>) {
      invoke();
      return ok();
    } else {
      return detail::write_result(invoke(), c);
    }
  };
  return add_raw(std::move(name), std::move(h), options);
}

}  // namespace troupe::rpc
