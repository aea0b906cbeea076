// full_mesh: Gloo's connectFullMesh, with a way out. Gloo's own waits for a peer's pair
// address in the store and, worse, in a pair's connect for the peer to connect (five times
// the context's timeout) cannot be ended from outside; a member that dies after publishing
// its addresses, or before it connects, holds the others there. This connects the same way
// (one store key per rank holding its pairs' addresses, then every pair in rank order) and,
// while it does, polls `interrupt`: when it returns an error, every pair is failed through
// Gloo's own exception path and the connect throws that error at once.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <troupe/core/error.hpp>

namespace troupe::collectives::gloo_mesh {

/// Polled while connecting; an error ends the connect with it.
using interrupt_fn = std::function<std::optional<troupe::error>()>;

/// Fails `pair` (a TCP pair) with `why` as a peer's closed connection would: every wait on
/// it, the connect's included, throws. False when `pair` is not a TCP pair.
bool fail_pair(gloo::transport::Pair* pair, const std::string& why);

/// A rendezvous context whose connect can be interrupted.
class context final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  /// Connects every pair through `store` (the keys "<rank>" as Gloo's connectFullMesh
  /// writes them), bounded by getTimeout() per wait, polling `interrupt` (may be empty)
  /// every 20 ms. Throws troupe::exception with the interrupt's error, or Gloo's error.
  void connect(gloo::rendezvous::Store& store, std::shared_ptr<gloo::transport::Device>& dev,
               const interrupt_fn& interrupt);
};

}  // namespace troupe::collectives::gloo_mesh
