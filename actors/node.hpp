// node: this worker's presence in the actor world. It joins a caf::actor_system to an RPC
// agent so that actors published on one worker can be messaged from every other one.
//
//   caf::actor_system_config cfg;
//   troupe::actors::configure(cfg);
//   auto types = std::make_shared<troupe::actors::message_types>();
//   troupe::actors::add_message_type<my_msg>(cfg, *types, "my_msg");
//   caf::actor_system sys{cfg};
//   auto w = troupe::init({.rpc = true}).value();        // any launcher (world/world.hpp)
//   auto n = troupe::actors::node::make(sys, w, types).value();   // or attach(sys, agent, types)
//   n->publish(sys.spawn(my_server), "server");           // "<this worker>/server"
//   caf::actor ps = n->remote_actor("w0/server").value(); // send / request as usual
//
// Contract:
// - A remote handle is a local proxy actor. send() and request() on it reach the remote
//   actor in the order this sender sent them; a request's reply (or its error) comes back
//   to the requester. Tells (plain sends) arrive without a sender.
// - The proxy exits when the remote actor exits, when its worker leaves, and when its
//   worker dies: monitor it (self->monitor(handle)) for a down message. In an elastic world
//   (troupe::init with TROUPE_ELASTIC=1) a worker is gone when the job's membership takes
//   it out, and the down reason is that membership_changed error, naming the epoch, the same
//   one the world's process group fails its pending work with. A request to a
//   proxy that has exited fails with CAF's request_receiver_down; a request pending when
//   the remote side goes away fails with peer_left or connection_lost.
// - Errors from troupe reach CAF code as caf::error of category "troupe"
//   (actors/system.hpp); unknown worker or actor names, and unregistered message types,
//   fail at once and name what was missing.
// - Nothing here blocks inside an actor handler: remote sends are queued to the RPC
//   agent, whose I/O threads deliver incoming messages into mailboxes.
// - membership_events() is a CAF group: joining it delivers
//   (joined_atom | left_atom | failed_atom, worker name, worker id) for every change the
//   agent sees.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/group.hpp>
#include <memory>
#include <string>
#include <string_view>

#include <troupe/actors/message_types.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/core/worker_info.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/world/world.hpp>

namespace troupe::actors {

using joined_atom = caf::atom_constant<caf::atom("joined")>;
using left_atom = caf::atom_constant<caf::atom("left")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;

struct node_options {
  /// Bound on the RPC side of remote requests (the requester's own CAF timeout still
  /// applies and is usually shorter). Zero: the agent's rpc_timeout.
  duration request_timeout = duration::zero();
  /// Bound on remote_actor()'s lookup when the caller gives none.
  duration lookup_timeout = std::chrono::seconds(10);
};

class node : public std::enable_shared_from_this<node> {
 public:
  /// Joins `sys` to `agent`: registers the functions remote messages arrive through and
  /// starts listening to membership changes. One node per agent. `types` must hold every
  /// message type this worker sends or receives (register them before attaching).
  static expected<std::shared_ptr<node>> attach(caf::actor_system& sys,
                                                std::shared_ptr<rpc::agent> agent,
                                                std::shared_ptr<const message_types> types,
                                                node_options options = {});
  /// attach() to the RPC agent of the world `w` (troupe::init with init_options::rpc set):
  ///   auto w = troupe::init({.rpc = true}).value();
  ///   auto n = troupe::actors::node::make(sys, w, types).value();
  /// errc::invalid_argument when the world has no agent.
  static expected<std::shared_ptr<node>> make(caf::actor_system& sys, const troupe::world& w,
                                              std::shared_ptr<const message_types> types,
                                              node_options options = {});
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// This worker.
  worker_info self() const;
  caf::actor_system& system() const noexcept;
  rpc::agent& agent() const noexcept;

  /// Publishes `a` as "<this worker>/<name>". Refuses an empty name, one with '/', and a
  /// name in use (already_exists).
  expected<void> publish(const caf::actor& a, const std::string& name);
  /// Withdraws a name; proxies elsewhere keep working until the actor itself exits.
  expected<void> unpublish(const std::string& name);

  /// A handle for the actor published as `path` ("worker/actor"). Asks the owner whether
  /// it exists (bounded by `timeout`, zero: options.lookup_timeout); fails with not_found
  /// naming the worker or the actor (and what is published there).
  expected<caf::actor> remote_actor(std::string_view path, duration timeout = duration::zero());

  /// remote_actor(), retried until the worker has joined and the actor is published there
  /// (for start-up, when peers publish while others already look). Fails with the last
  /// lookup's error once `timeout` has passed.
  expected<caf::actor> await_actor(std::string_view path, duration timeout);

  /// A typed handle for `path` (CAF does not check the remote interface: the caller
  /// asserts it).
  template <class Handle>
  expected<Handle> remote_typed_actor(std::string_view path, duration timeout = duration::zero()) {
    auto a = remote_actor(path, timeout);
    if (!a) return std::move(a).error();
    return caf::actor_cast<Handle>(*a);
  }

  /// The group of membership events (see the contract above).
  caf::group membership_events() const;

  /// Stops accepting remote messages, fails pending requests with shut_down and lets
  /// every proxy exit. Idempotent; the destructor calls it. To serve others until the
  /// group ends, shut the agent down first (a static agent's shutdown waits for every
  /// worker), then the node.
  void shutdown();

  struct impl;

 private:
  explicit node(std::shared_ptr<impl> i);
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::actors
