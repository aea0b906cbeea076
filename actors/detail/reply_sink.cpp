#include <troupe/actors/detail/reply_sink.hpp>

#include <caf/actor_system.hpp>
#include <caf/make_actor.hpp>

namespace troupe::actors::detail {

reply_sink::reply_sink(caf::actor_config& cfg, handler on_reply)
    : caf::monitorable_actor(cfg), on_reply_(std::move(on_reply)) {}

void reply_sink::enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) {
  if (!what || !what->mid.is_response()) return;  // only answers to our requests come here
  auto reply = what->move_content_to_message();
  on_reply_(what->mid.request_id().integer_value(), reply);
}

caf::strong_actor_ptr make_reply_sink(caf::actor_system& sys, reply_sink::handler on_reply) {
  caf::actor_config cfg;
  return caf::make_actor<reply_sink, caf::strong_actor_ptr>(sys.next_actor_id(), sys.node(), &sys,
                                                            cfg, std::move(on_reply));
}

}  // namespace troupe::actors::detail
