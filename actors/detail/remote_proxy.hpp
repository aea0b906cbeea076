// remote_proxy: the local stand-in of an actor published on another worker. It is not a
// scheduled actor: enqueue() encodes the message and hands it to the RPC agent on the
// sender's own thread, so a remote send costs no extra mailbox hop. It exits (monitors see
// a down message) when the remote actor exits or its worker leaves or dies; a request to
// an exited proxy is answered with CAF's request_receiver_down.
#pragma once

#include <caf/actor_config.hpp>
#include <caf/actor_proxy.hpp>
#include <caf/mailbox_element.hpp>
#include <memory>
#include <string>

namespace troupe::actors::detail {

/// What a proxy needs from the node: where to send.
class proxy_sink {
 public:
  virtual ~proxy_sink() = default;
  /// A plain send to worker/name.
  virtual void tell(const std::string& worker, const std::string& name, caf::message msg) = 0;
  /// A request to worker/name; the reply (or error) goes to `sender` as the response to `mid`.
  virtual void ask(const std::string& worker, const std::string& name, caf::message msg,
                   caf::strong_actor_ptr sender, caf::message_id mid) = 0;
};

class remote_proxy final : public caf::actor_proxy {
 public:
  remote_proxy(caf::actor_config& cfg, std::weak_ptr<proxy_sink> sink, std::string worker,
               std::string name);

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override;
  /// Ends the proxy with `reason`: monitors and links fire. Idempotent.
  void kill_proxy(caf::execution_unit* host, caf::error reason) override;
  const char* name() const override { return "troupe.remote_proxy"; }

 private:
  std::weak_ptr<proxy_sink> sink_;
  std::string worker_;
  std::string name_;
};

/// Creates a proxy for worker/name in `sys`.
caf::actor make_remote_proxy(caf::actor_system& sys, std::weak_ptr<proxy_sink> sink,
                             std::string worker, std::string name);

}  // namespace troupe::actors::detail
