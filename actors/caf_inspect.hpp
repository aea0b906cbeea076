// The bridge between CAF's inspect annotations and troupe's serializer: CAF's
// `caf::meta::type_name("...")` and friends derive from caf::meta::annotation and carry no
// data, so troupe's binary inspectors skip them. With this header included, one
//
//   template <class Inspector>
//   typename Inspector::result_type inspect(Inspector& f, point& p) {
//     return f(caf::meta::type_name("point"), p.x, p.y);
//   }
//
// serves CAF (add_message_type, to_string) and troupe (RPC arguments, remote messages).
// Every actors/ header that serializes includes it, so the hook is seen wherever CAF
// annotations meet troupe's inspectors.
#pragma once

#include <caf/deserializer.hpp>
#include <caf/meta/annotation.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>
#include <sstream>
#include <type_traits>

#include <troupe/core/tensor.hpp>
#include <troupe/rpc/inspect.hpp>

namespace troupe::rpc {

template <class T>
struct is_annotation<T, std::enable_if_t<std::is_base_of_v<caf::meta::annotation, T>>>
    : std::true_type {};

}  // namespace troupe::rpc

namespace troupe {

/// CAF's side of a tensor inside a message type. troupe's own inspectors move tensors
/// beside the message bytes and never call this; CAF calls it to print a message
/// (a description: dtype, shape, device) and would call it to serialize one through its
/// own middleman, which cannot carry tensors: that fails with an error saying so.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor& t) {
  if constexpr (std::is_base_of_v<caf::serializer, Inspector> ||
                std::is_base_of_v<caf::deserializer, Inspector>) {
    static_cast<void>(f);
    static_cast<void>(t);
    return caf::make_error(caf::sec::state_not_serializable,
                           "troupe tensors travel only in troupe's remote messages, not "
                           "through CAF's middleman");
  } else {
    std::ostringstream desc;
    desc << "tensor(" << to_string(t.type()) << ", [";
    for (std::size_t i = 0; i < t.shape().size(); ++i) desc << (i ? "," : "") << t.shape()[i];
    desc << "], " << t.dev().to_string() << ")";
    std::string s = desc.str();
    return f(s);
  }
}

}  // namespace troupe
