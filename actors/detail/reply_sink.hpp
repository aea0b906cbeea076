// reply_sink: the sender of requests that arrive from other workers. The node enqueues a
// remote request straight into the target's mailbox with this actor as the sender and a
// request id of its own; the target's response is enqueued here, on the target's thread,
// and handed to `on_reply` with that id. No scheduled actor, no extra hop.
#pragma once

#include <caf/actor_config.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/monitorable_actor.hpp>
#include <functional>

namespace troupe::actors::detail {

class reply_sink final : public caf::monitorable_actor {
 public:
  using handler = std::function<void(std::uint64_t request, caf::message& reply)>;

  reply_sink(caf::actor_config& cfg, handler on_reply);

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override;
  const char* name() const override { return "troupe.reply_sink"; }

 private:
  handler on_reply_;
};

/// Creates a reply sink in `sys`.
caf::strong_actor_ptr make_reply_sink(caf::actor_system& sys, reply_sink::handler on_reply);

}  // namespace troupe::actors::detail
