// any_response: a CAF response handler that accepts whatever comes back, errors included.
// CAF 0.17's event-based request().then() needs the reply's types at compile time; a
// relay forwarding requests for remote senders does not know them, so it registers this
// behaviour for the request's response id instead.
#pragma once

#include <caf/behavior.hpp>
#include <caf/detail/behavior_impl.hpp>
#include <caf/detail/invoke_result_visitor.hpp>
#include <caf/message.hpp>
#include <functional>
#include <utility>

namespace troupe::actors::detail {

class any_response final : public caf::detail::behavior_impl {
 public:
  explicit any_response(std::function<void(caf::message&)> f) : f_(std::move(f)) {}

  caf::match_case::result invoke(caf::detail::invoke_result_visitor& v,
                                 caf::type_erased_tuple& xs) override {
    caf::message m = caf::message::copy(xs);
    f_(m);
    v();  // produces no message of its own
    return caf::match_case::match;
  }

 private:
  std::function<void(caf::message&)> f_;
};

/// A behaviour that hands any response (a reply or a caf::error) to `f`.
inline caf::behavior on_any_response(std::function<void(caf::message&)> f) {
  return caf::behavior{caf::behavior::impl_ptr{caf::make_counted<any_response>(std::move(f))}};
}

}  // namespace troupe::actors::detail
