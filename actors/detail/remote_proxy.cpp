#include <troupe/actors/detail/remote_proxy.hpp>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/make_actor.hpp>
#include <caf/sec.hpp>
#include <caf/system_messages.hpp>

namespace troupe::actors::detail {

remote_proxy::remote_proxy(caf::actor_config& cfg, std::weak_ptr<proxy_sink> sink,
                           std::string worker, std::string name)
    : caf::actor_proxy(cfg),
      sink_(std::move(sink)),
      worker_(std::move(worker)),
      name_(std::move(name)) {}

void remote_proxy::enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) {
  if (!what) return;
  auto sink = sink_.lock();
  if (!sink || getf(is_terminated_flag)) {
    bounce(what);  // a request gets the exit reason as its error
    return;
  }
  const auto mid = what->mid;
  caf::message msg = what->move_content_to_message();
  // An exit message is about this handle, not for the remote actor.
  if (msg.match_elements<caf::exit_msg>()) {
    auto& e = msg.get_as<caf::exit_msg>(0);
    if (e.reason && e.reason != caf::exit_reason::normal) kill_proxy(host, e.reason);
    return;
  }
  if (mid.is_request())
    sink->ask(worker_, name_, std::move(msg), std::move(what->sender), mid);
  else
    sink->tell(worker_, name_, std::move(msg));
}

void remote_proxy::kill_proxy(caf::execution_unit* host, caf::error reason) {
  cleanup(std::move(reason), host);
}

caf::actor make_remote_proxy(caf::actor_system& sys, std::weak_ptr<proxy_sink> sink,
                             std::string worker, std::string name) {
  caf::actor_config cfg;
  auto p = caf::make_actor<remote_proxy, caf::strong_actor_ptr>(sys.next_actor_id(), sys.node(),
                                                                &sys, cfg, std::move(sink),
                                                                std::move(worker), std::move(name));
  return caf::actor_cast<caf::actor>(std::move(p));
}

}  // namespace troupe::actors::detail
