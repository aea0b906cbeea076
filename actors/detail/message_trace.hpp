// message_trace: the trace spans of actor messages between workers (docs/tracing.md,
// category "actors"). The sender records "send <actor>" for a plain send (until the
// message is handed to RPC) or "request <actor>" for a request (until its answer or error
// is back); the receiver records "receive <actor>" (decoding the message and putting it
// into the actor's mailbox). An arrow joins the two; both sides derive its id from what
// they know already (trace::flow_id): the sender's worker id and, for a plain send, the
// RPC request id that carried it, for a request, the sender's request id (`ask`), which is
// known before it is sent. Nothing extra travels. Internal to actors/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/tensor.hpp>
#include <troupe/core/trace.hpp>

namespace troupe::actors::detail {

/// The bytes a message carries: its encoded form and its tensors.
std::uint64_t message_bytes(const bytes& payload, const std::vector<tensor>& tensors) noexcept;

/// One message's span, started when tracing is on at construction. Not thread-safe; may be
/// moved to the thread that ends it.
class message_span {
 public:
  /// Starts the span now if tracing is on.
  message_span() : start_ns_(trace::enabled() ? trace::now_ns() : 0) {
    if (start_ns_ != 0) tid_ = trace::thread_id();
  }
  /// Whether it will be recorded.
  bool on() const noexcept { return start_ns_ != 0; }
  /// Where the RPC layer writes the request id of the call that carries the message
  /// (rpc::call_options::request_id); null when not traced, so the RPC layer skips it.
  std::uint64_t* request_id() noexcept { return on() ? &call_ : nullptr; }
  /// The request id written there (0: none).
  std::uint64_t call() const noexcept { return call_; }
  /// Details: the actor (its published name), the peer worker, the bytes.
  void describe(std::string_view actor, std::string_view peer, std::uint64_t bytes);
  /// Adds why the message failed (shown as `error`).
  void set_error(std::string_view why);
  /// Adds a number (such as the request's `ask` id).
  void add(std::string_view key, std::uint64_t value);
  /// Records the span `<verb> <actor>` ("send", "request", "receive") from its start until
  /// now, with the arrows of `f`, on the thread that started it. Once.
  void end(std::string_view verb, trace::flow f);

 private:
  std::int64_t start_ns_ = 0;
  std::int64_t tid_ = 0;
  std::uint64_t call_ = 0;
  std::string actor_;
  trace::args args_;
};

}  // namespace troupe::actors::detail
