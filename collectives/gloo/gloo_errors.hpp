// Where the gloo backend turns exceptions into troupe::error. Internal to collectives/gloo.
//
// Gloo reports every failure by throwing (gloo::IoException for timeouts and broken
// connections, gloo::Exception for misuse), and so must what Gloo calls back: the store
// adapter behind its rendezvous and the full-mesh connect throw, and the direct
// algorithms' calls into Gloo's buffers let its exceptions through. Everything of ours
// speaks expected<T> (the shared-memory segment included): each call that reaches Gloo
// goes through guard(), the one place where an exception becomes the error it stands for.
#pragma once

#include <type_traits>
#include <utility>

#include <troupe/core/error.hpp>
#include <troupe/core/expected.hpp>

namespace gloo {
struct IoException;
}  // namespace gloo

namespace troupe::collectives::gloo_errors {

/// The error a gloo::IoException stands for: errc::timeout when Gloo timed out, else
/// errc::connection_lost, with the message "gloo: <what>".
troupe::error error_of(const gloo::IoException& e);

/// The error the exception being handled stands for: a troupe::exception's own error,
/// error_of() for a gloo::IoException, errc::internal naming what() for any other.
/// Call only inside a catch block.
troupe::error current_error();

/// Runs `f` (returning void or expected<void>) and returns its outcome, with an exception
/// it throws turned into current_error(); nothing it throws gets past.
template <class F>
expected<void> guard(F&& f) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      return ok();
    } else {
      return f();
    }
  } catch (...) {
    return current_error();
  }
}

}  // namespace troupe::collectives::gloo_errors
