// control_messages: what two actor nodes say to each other, one named struct per RPC
// function of the actors layer (node.cpp registers them). Internal to actors/.
//
// Each struct is one RPC argument; its fields travel in the order `inspect` lists them, and
// its tensors travel beside the arguments as every RPC tensor does. A field added here
// changes the wire form of the actors layer: add it last and bump the RPC wire version
// when peers of different builds must keep talking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/error.hpp>
#include <troupe/core/tensor.hpp>

namespace troupe::actors::detail {

/// "actors.deliver": a message for actor `target` of the receiving worker.
struct deliver_message {
  std::string target;
  /// The sender's id for the reply it awaits; 0: a plain send, nobody awaits a reply.
  std::uint64_t ask_id = 0;
  bytes payload;  // message_types' byte form of the CAF message
  std::vector<tensor> tensors;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deliver_message& x) {
  return f(x.target, x.ask_id, x.payload, x.tensors);
}

/// "actors.answer": the reply to a request (`ask_id` of the receiver), or why it failed.
struct answer_message {
  std::uint64_t ask_id = 0;
  bool ok = false;
  bytes payload;  // when ok
  std::vector<tensor> tensors;
  error failure;  // when !ok
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, answer_message& x) {
  return f(x.ask_id, x.ok, x.payload, x.tensors, x.failure);
}

/// "actors.watch": report the exit of published actor `target` as watch `watch_id`.
struct watch_request {
  std::string target;
  std::uint64_t watch_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, watch_request& x) {
  return f(x.target, x.watch_id);
}

/// "actors.down": the actor behind watch `watch_id` exited, normally or with `reason`.
struct down_message {
  std::uint64_t watch_id = 0;
  bool normal = false;
  error reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, down_message& x) {
  return f(x.watch_id, x.normal, x.reason);
}

}  // namespace troupe::actors::detail
