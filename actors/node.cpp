// Why this file is long (~610 lines): node::impl is one state machine over one set of
// tables (published names, proxies of remote actors, pending asks, monitors by peer) that
// the RPC handlers, the membership listener and the public calls all update under one
// lock; the parts that need none of it are in actors/detail/ (the proxies, the control
// messages, the tracing of messages). The RPC handlers are the next piece to move out.
#include <troupe/actors/node.hpp>

#include <caf/all.hpp>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <troupe/actors/detail/control_messages.hpp>
#include <troupe/actors/detail/inline_unit.hpp>
#include <troupe/actors/detail/message_trace.hpp>
#include <troupe/actors/detail/remote_proxy.hpp>
#include <troupe/actors/detail/reply_sink.hpp>
#include <troupe/actors/system.hpp>
#include <troupe/core/log.hpp>

namespace troupe::actors {

namespace {

// Ends proxy `a` with `reason` (which may be the normal one).
void kill_proxy(const caf::weak_actor_ptr& w, caf::error reason) {
  auto p = caf::actor_cast<caf::strong_actor_ptr>(w);
  if (!p) return;
  static_cast<detail::remote_proxy*>(caf::actor_cast<caf::abstract_actor*>(p))
      ->kill_proxy(nullptr, std::move(reason));
}

// Answers request `mid` of `sender` with `msg`.
void respond(const caf::strong_actor_ptr& sender, caf::message_id mid, caf::message msg) {
  if (sender)
    sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {}, std::move(msg)),
                    nullptr);
}

// The RPC functions of the actors layer; their arguments are in detail/control_messages.hpp.
constexpr const char* fn_lookup = "actors.lookup";    // the name of a published actor
constexpr const char* fn_deliver = "actors.deliver";  // detail::deliver_message
constexpr const char* fn_answer = "actors.answer";    // detail::answer_message
constexpr const char* fn_watch = "actors.watch";      // detail::watch_request
constexpr const char* fn_down = "actors.down";        // detail::down_message

}  // namespace

struct node::impl : detail::proxy_sink, std::enable_shared_from_this<node::impl> {
  impl(caf::actor_system& s, std::shared_ptr<rpc::agent> a, std::shared_ptr<const message_types> t,
       node_options o)
      : sys(s), agent(std::move(a)), types(std::move(t)), opts(o) {}

  caf::actor_system& sys;
  std::shared_ptr<rpc::agent> agent;
  std::shared_ptr<const message_types> types;
  node_options opts;
  worker_info me;
  caf::strong_actor_ptr sink;  // the sender of requests from other workers
  caf::group events;

  struct pending_ask {
    caf::strong_actor_ptr sender;
    caf::message_id mid;
    std::string worker;
    deadline until;
    detail::message_span traced;  // "request <actor>", ended with the answer
    trace::flow flow;             // its arrow to the receiver
    void answer(caf::message m) {
      traced.end("request", flow);
      respond(sender, mid, std::move(m));
    }
    void fail(const error& e) {
      traced.set_error(e.message());
      answer(caf::make_message(to_caf_error(e)));
    }
  };
  struct incoming_ask {
    std::string caller;
    std::uint64_t id = 0;
  };
  struct proxy_entry {
    caf::weak_actor_ptr proxy;
    std::string worker;
    std::string name;
  };

  std::mutex mu;
  std::map<std::string, caf::actor> published;
  std::unordered_map<std::uint64_t, pending_ask> asks;
  std::unordered_map<std::uint64_t, proxy_entry> proxies;    // by watch id
  std::unordered_map<std::uint64_t, incoming_ask> incoming;  // by our request id
  std::atomic<std::uint64_t> next_id{1};
  std::uint64_t listener_id = 0;
  bool stopped = false;
  std::condition_variable wake_sweeper;
  std::thread sweeper;

  // Plain sends combine their writes (a stream of them leaves in batches); requests and
  // answers are written at once, behind whatever was queued before them.
  rpc::call_options call_opts(bool combine) const {
    rpc::call_options o;
    o.timeout = opts.request_timeout;
    o.combine_writes = combine;
    return o;
  }

  std::string path_of(const std::string& worker, const std::string& name) const {
    return worker + "/" + name;
  }

  // ---- caller side ------------------------------------------------------------------

  // A plain send from a local actor to worker/name.
  void tell(const std::string& worker, const std::string& name, caf::message msg) override {
    detail::message_span traced;
    detail::deliver_message m{name, 0, {}, {}};
    if (auto r = types->encode(msg, m.payload, &m.tensors); !r) {
      TROUPE_LOG(log_level::warn, "actors", "dropping a message to ", path_of(worker, name), ": ",
                 r.error());
      return;
    }
    traced.describe(name, worker, detail::message_bytes(m.payload, m.tensors));
    auto self = weak_from_this();
    auto o = call_opts(true);
    o.request_id = traced.request_id();
    auto sent = agent->notify(o, worker, fn_deliver, m);
    const auto call = traced.call();
    traced.end("send",
               {call != 0 ? trace::flow_id(me.id, call, trace::flow_channel::actor_send) : 0, 0});
    std::move(sent).on_complete([self, worker, name](expected<void>&& r) {
      if (r) return;
      // A full send queue (backpressure past the timeout) is worth a warning; a
      // departed worker is reported through its proxies below.
      TROUPE_LOG(r.error().code() == errc::timeout ? log_level::warn : log_level::debug, "actors",
                 "a message to ", worker, "/", name, " was not delivered: ", r.error());
      if (auto n = self.lock()) n->on_call_failed(worker, r.error());
    });
  }

  // A request from a local actor to worker/name; `rp` answers the requester.
  void ask(const std::string& worker, const std::string& name, caf::message msg,
           caf::strong_actor_ptr sender, caf::message_id mid) override {
    detail::deliver_message m{name, 0, {}, {}};
    pending_ask p{std::move(sender), mid, worker, deadline::after(duration::zero()), {}, {}};
    auto encoded = types->encode(msg, m.payload, &m.tensors);
    p.traced.describe(name, worker, detail::message_bytes(m.payload, m.tensors));
    if (!encoded) {
      p.fail(encoded.error().with_operation("request to " + path_of(worker, name)));
      return;
    }
    const std::uint64_t id = next_id.fetch_add(1);
    p.traced.add("ask", id);
    if (p.traced.on()) p.flow.out = trace::flow_id(me.id, id, trace::flow_channel::actor_request);
    {
      std::unique_lock lk(mu);
      if (stopped) {
        lk.unlock();
        p.fail(error(errc::shut_down, "the actor node of this worker has shut down"));
        return;
      }
      auto timeout = opts.request_timeout > duration::zero() ? opts.request_timeout
                                                             : agent->options().rpc_timeout;
      p.until = deadline::after(timeout);
      asks.emplace(id, std::move(p));
    }
    // One-way: the answer (or the callee's refusal) comes back as a call of its own.
    auto self = weak_from_this();
    m.ask_id = id;
    agent->notify(call_opts(false), worker, fn_deliver, m)
        .on_complete([self, id, worker](expected<void>&& r) {
          if (r) return;
          auto n = self.lock();
          if (!n) return;
          n->finish_ask(id, std::move(r).error());
          n->on_call_failed(worker, error(errc::internal, ""));
        });
  }

  // Ends a pending request with an error (no-op when it already ended).
  void finish_ask(std::uint64_t id, error e) {
    std::optional<pending_ask> p;
    {
      std::lock_guard lk(mu);
      auto it = asks.find(id);
      if (it == asks.end()) return;
      p = std::move(it->second);
      asks.erase(it);
    }
    p->fail(e);
  }

  // A call to `worker` failed: if the worker is gone, every proxy of it exits and every
  // request pending there fails.
  void on_call_failed(const std::string& worker, const error&) {
    if (agent->worker(worker)) return;  // still a member: the failure was the call's own
    worker_gone(worker,
                error(errc::peer_left, "worker '" + worker + "' is no longer in the group"));
  }

  void on_membership(const rpc::membership_event& e) {
    const auto& w = e.worker;
    switch (e.change) {
      case rpc::membership_change::joined:
        caf::anon_send(events, joined_atom::value, w.name, w.id);
        break;
      case rpc::membership_change::left:
        worker_gone(
            w.name,
            error(errc::peer_left, "worker '" + w.name + "' left the group").with_worker(w.name));
        caf::anon_send(events, left_atom::value, w.name, w.id);
        break;
      case rpc::membership_change::failed:
        // Taken out by the job's membership: its reason (membership_changed, naming the
        // epoch) is the one every part of the job sees.
        worker_gone(w.name, e.reason.code() == errc::membership_changed
                                ? error(e.reason).with_worker(w.name)
                                : error(errc::connection_lost,
                                        "worker '" + w.name + "' failed: " + e.reason.message())
                                      .with_worker(w.name));
        caf::anon_send(events, failed_atom::value, w.name, w.id);
        break;
      case rpc::membership_change::unreachable:
        break;  // still a member until the job's membership decides (then `failed`)
    }
  }

  void worker_gone(const std::string& worker, const error& why) {
    std::vector<pending_ask> failed;
    std::vector<caf::weak_actor_ptr> dead;
    {
      std::lock_guard lk(mu);
      for (auto it = asks.begin(); it != asks.end();) {
        if (it->second.worker == worker) {
          failed.push_back(std::move(it->second));
          it = asks.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = proxies.begin(); it != proxies.end();) {
        if (it->second.worker == worker) {
          dead.push_back(it->second.proxy);
          it = proxies.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& p : failed) p.fail(why);
    for (auto& w : dead) kill_proxy(w, to_caf_error(why));
  }

  // ---- callee side ------------------------------------------------------------------

  expected<caf::actor> find_published(const std::string& name) {
    std::lock_guard lk(mu);
    auto it = published.find(name);
    if (it != published.end()) return it->second;
    std::string names;
    for (const auto& [n, a] : published) names += (names.empty() ? "" : ", ") + n;
    return make_error(errc::not_found, "no actor named '", name, "' is published on worker '",
                      me.name, "' (published there: ", names.empty() ? "none" : names, ")");
  }

  // Arrives as a one-way call: a request's refusal goes back through the answer path, a
  // plain send's is logged here (there is nobody to tell).
  void on_deliver(const rpc::call_info& info, detail::deliver_message& m) {
    detail::message_span traced;
    traced.describe(m.target, info.caller.name, detail::message_bytes(m.payload, m.tensors));
    traced.add("call", info.call);
    if (m.ask_id != 0) traced.add("ask", m.ask_id);
    const trace::flow arrow{
        0, m.ask_id != 0
               ? trace::flow_id(info.caller.id, m.ask_id, trace::flow_channel::actor_request)
               : trace::flow_id(info.caller.id, info.call, trace::flow_channel::actor_send)};
    // The span ends as the message enters the mailbox (deliver), before the actor runs.
    auto r = deliver(info, m.target, m.ask_id, m.payload, m.tensors,
                     [&] { traced.end("receive", arrow); });
    if (!r) traced.set_error(r.error().message());
    traced.end("receive", arrow);
    if (r) return;
    if (m.ask_id != 0) return send_error_answer(info.caller.name, m.ask_id, r.error());
    TROUPE_LOG(log_level::warn, "actors", "dropped a message from ", info.caller.name, " to ",
               path_of(me.name, m.target), ": ", r.error());
  }

  // `entering` runs just before the message enters the actor's mailbox.
  template <class Entering>
  expected<void> deliver(const rpc::call_info& info, const std::string& target,
                         std::uint64_t ask_id, const bytes& payload, std::vector<tensor>& tensors,
                         Entering&& entering) {
    auto a = find_published(target);
    if (!a) return std::move(a).error();
    auto msg = types->decode(payload, &tensors);
    if (!msg)
      return std::move(msg).error().with_operation("message to " + path_of(me.name, target));
    // Straight into the target's mailbox, in arrival order. A request carries the reply
    // sink as its sender and a request id of ours; the answer comes back through it.
    // The target runs on this I/O thread when a message wakes it (detail/inline_unit.hpp):
    // a request at once (one thread switch less on the way to the answer), plain sends
    // once the frames of this read are handled, so a stream of them costs one run per read
    // and no scheduler wake-up per message. Either way it takes them in mailbox order.
    auto& unit = detail::inline_unit::of(sys);
    auto* dest = caf::actor_cast<caf::abstract_actor*>(*a);
    entering();
    if (ask_id == 0) {
      unit.deliver_batched(
          *dest, caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(*msg)));
      return ok();
    }
    const std::uint64_t sid = next_id.fetch_add(1);
    {
      std::lock_guard lk(mu);
      incoming.emplace(sid, incoming_ask{info.caller.name, ask_id});
    }
    unit.deliver(*dest,
                 caf::make_mailbox_element(sink, caf::make_message_id(sid), {}, std::move(*msg)));
    return ok();
  }

  // The reply sink got the answer to our request `sid`.
  void on_reply(std::uint64_t sid, caf::message& reply) {
    incoming_ask in;
    {
      std::lock_guard lk(mu);
      auto it = incoming.find(sid);
      if (it == incoming.end()) return;
      in = std::move(it->second);
      incoming.erase(it);
    }
    send_answer(in.caller, in.id, reply);
  }

  void send_error_answer(const std::string& caller, std::uint64_t id, error err) {
    err.with_worker(me.name);
    detail::answer_message m{id, false, {}, {}, std::move(err)};
    agent->notify(call_opts(false), caller, fn_answer, m).on_complete([caller](expected<void>&& r) {
      if (!r)
        TROUPE_LOG(log_level::debug, "actors", "an error reply to ", caller,
                   " was lost: ", r.error());
    });
  }

  // Sends `reply` for request `id` of `caller` back.
  void send_answer(const std::string& caller, std::uint64_t id, caf::message& reply) {
    detail::answer_message m{id, true, {}, {}, {}};
    if (reply.match_elements<caf::error>()) {
      m.ok = false;
      m.failure = from_caf_error(reply.get_as<caf::error>(0));
    } else if (auto r = types->encode(reply, m.payload, &m.tensors); !r) {
      m.ok = false;
      m.failure = std::move(r).error().with_operation("reply");
      m.payload.clear();
      m.tensors.clear();
    }
    if (!m.ok) m.failure.with_worker(me.name);
    agent->notify(call_opts(false), caller, fn_answer, m).on_complete([caller](expected<void>&& r) {
      if (!r)
        TROUPE_LOG(log_level::debug, "actors", "a reply to ", caller, " was lost: ", r.error());
    });
  }

  void on_answer(detail::answer_message& a) {
    std::optional<pending_ask> p;
    {
      std::lock_guard lk(mu);
      auto it = asks.find(a.ask_id);
      if (it == asks.end()) return;  // timed out or failed meanwhile
      p = std::move(it->second);
      asks.erase(it);
    }
    if (!a.ok) return p->fail(a.failure);
    auto msg = types->decode(a.payload, &a.tensors);
    if (!msg) return p->fail(msg.error());
    p->answer(std::move(*msg));
  }

  expected<void> on_watch(const rpc::call_info& info, const std::string& target,
                          std::uint64_t watch_id) {
    auto a = find_published(target);
    if (!a) return std::move(a).error();
    auto self = weak_from_this();
    std::string caller = info.caller.name;
    caf::actor_cast<caf::abstract_actor*>(*a)->attach_functor(
        [self, caller, watch_id](const caf::error& reason) {
          auto n = self.lock();
          if (!n) return;
          bool normal = !reason || reason == caf::exit_reason::normal;
          error why = normal ? error(errc::peer_left, "exited normally") : from_caf_error(reason);
          n->agent->notify(caller, fn_down, detail::down_message{watch_id, normal, why})
              .on_complete([](expected<void>&&) {});
        });
    return ok();
  }

  void on_down(const detail::down_message& d) {
    const bool normal = d.normal;
    const error& why = d.reason;
    caf::weak_actor_ptr w;
    std::string path;
    {
      std::lock_guard lk(mu);
      auto it = proxies.find(d.watch_id);
      if (it == proxies.end()) return;
      w = it->second.proxy;
      path = path_of(it->second.worker, it->second.name);
      proxies.erase(it);
    }
    if (normal)
      kill_proxy(w, caf::exit_reason::normal);
    else
      kill_proxy(
          w, to_caf_error(error(why.code(), "remote actor " + path + " exited: " + why.message())));
  }

  // ---- lifecycle --------------------------------------------------------------------

  void sweep_loop() {
    std::unique_lock lk(mu);
    while (!stopped) {
      wake_sweeper.wait_for(lk, std::chrono::milliseconds(100));
      std::vector<pending_ask> late;
      for (auto it = asks.begin(); it != asks.end();) {
        if (it->second.until.expired()) {
          late.push_back(std::move(it->second));
          it = asks.erase(it);
        } else {
          ++it;
        }
      }
      if (late.empty()) continue;
      lk.unlock();
      for (auto& p : late) p.fail(error(errc::timeout, "no reply from " + p.worker + " in time"));
      lk.lock();
    }
  }

  void stop() {
    std::vector<pending_ask> failed;
    std::vector<caf::weak_actor_ptr> dead;
    agent->remove_membership_listener(listener_id);
    {
      std::lock_guard lk(mu);
      if (stopped) return;
      stopped = true;
      for (auto& [id, p] : asks) failed.push_back(std::move(p));
      asks.clear();
      for (auto& [id, p] : proxies) dead.push_back(p.proxy);
      proxies.clear();
      published.clear();
      incoming.clear();
    }
    wake_sweeper.notify_all();
    if (sweeper.joinable()) sweeper.join();
    auto why = error(errc::shut_down, "the actor node of worker '" + me.name + "' has shut down");
    for (auto& p : failed) p.fail(why);
    for (auto& w : dead) kill_proxy(w, to_caf_error(why));
  }
};

expected<std::shared_ptr<node>> node::make(caf::actor_system& sys, const troupe::world& w,
                                           std::shared_ptr<const message_types> types,
                                           node_options options) {
  if (!w.rpc())
    return make_error(errc::invalid_argument,
                      "actors::node::make needs a world with an RPC agent: call troupe::init "
                      "with init_options::rpc = true");
  return attach(sys, w.rpc(), std::move(types), std::move(options));
}

expected<std::shared_ptr<node>> node::attach(caf::actor_system& sys,
                                             std::shared_ptr<rpc::agent> agent,
                                             std::shared_ptr<const message_types> types,
                                             node_options options) {
  if (!agent) return make_error(errc::invalid_argument, "node::attach needs an RPC agent");
  if (!types)
    return make_error(errc::invalid_argument, "node::attach needs a message_types registry");
  auto i = std::make_shared<impl>(sys, std::move(agent), std::move(types), options);
  i->me = i->agent->self();
  std::weak_ptr<impl> w = i;
  i->sink = detail::make_reply_sink(sys, [w](std::uint64_t sid, caf::message& reply) {
    if (auto n = w.lock()) n->on_reply(sid, reply);
  });
  i->events = sys.groups().get_local("troupe/membership/" + i->me.name);

  rpc::function_options inline_fn;
  inline_fn.run_inline = true;  // short and non-blocking: keeps arrival order, saves hops
  auto& fns = i->agent->functions();
  TROUPE_TRY(fns.add(
      fn_lookup,
      [w](const std::string& name) -> expected<void> {
        auto n = w.lock();
        if (!n) return make_error(errc::shut_down, "the actor node has shut down");
        auto a = n->find_published(name);
        if (!a) return std::move(a).error();
        return ok();
      },
      inline_fn));
  TROUPE_TRY(fns.add(
      fn_deliver,
      [w](const rpc::call_info& info, detail::deliver_message m) {
        if (auto n = w.lock()) n->on_deliver(info, m);
      },
      inline_fn));
  TROUPE_TRY(fns.add(
      fn_answer,
      [w](detail::answer_message a) {
        if (auto n = w.lock()) n->on_answer(a);
      },
      inline_fn));
  TROUPE_TRY(fns.add(
      fn_watch,
      [w](const rpc::call_info& info, const detail::watch_request& r) -> expected<void> {
        auto n = w.lock();
        if (!n) return make_error(errc::shut_down, "the actor node has shut down");
        return n->on_watch(info, r.target, r.watch_id);
      },
      inline_fn));
  TROUPE_TRY(fns.add(
      fn_down,
      [w](const detail::down_message& d) {
        if (auto n = w.lock()) n->on_down(d);
      },
      inline_fn));
  i->listener_id = i->agent->add_membership_listener([w](const rpc::membership_event& e) {
    if (auto n = w.lock()) n->on_membership(e);
  });
  i->sweeper = std::thread([raw = i.get()] { raw->sweep_loop(); });
  return std::shared_ptr<node>(new node(std::move(i)));
}

node::node(std::shared_ptr<impl> i) : impl_(std::move(i)) {}

node::~node() { shutdown(); }

void node::shutdown() { impl_->stop(); }

worker_info node::self() const { return impl_->me; }
caf::actor_system& node::system() const noexcept { return impl_->sys; }
rpc::agent& node::agent() const noexcept { return *impl_->agent; }
caf::group node::membership_events() const { return impl_->events; }

expected<void> node::publish(const caf::actor& a, const std::string& name) {
  if (!a)
    return make_error(errc::invalid_argument, "cannot publish an invalid actor as '", name, "'");
  if (name.empty() || name.find('/') != std::string::npos)
    return make_error(errc::invalid_argument, "actor name '", name,
                      "' must be non-empty and contain no '/' (it is addressed as worker/name)");
  std::lock_guard lk(impl_->mu);
  if (impl_->stopped) return make_error(errc::shut_down, "the actor node has shut down");
  auto [it, inserted] = impl_->published.emplace(name, a);
  if (!inserted)
    return make_error(errc::already_exists, "an actor is already published as '", name,
                      "' on worker '", impl_->me.name,
                      "'; unpublish it first or pick another name");
  return ok();
}

expected<void> node::unpublish(const std::string& name) {
  std::lock_guard lk(impl_->mu);
  if (impl_->published.erase(name) == 0)
    return make_error(errc::not_found, "no actor is published as '", name, "' on worker '",
                      impl_->me.name, "'");
  return ok();
}

expected<caf::actor> node::remote_actor(std::string_view path, duration timeout) {
  auto slash = path.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == path.size() ||
      path.find('/', slash + 1) != std::string_view::npos)
    return make_error(errc::invalid_argument, "actor path '", path,
                      "' must be 'worker/actor' (for example 'trainer0/ps')");
  std::string worker(path.substr(0, slash));
  std::string name(path.substr(slash + 1));
  auto who = impl_->agent->worker(worker);
  if (!who) return std::move(who).error().with_operation(strcat("remote_actor '", path, "'"));
  rpc::call_options o;
  o.timeout = timeout > duration::zero() ? timeout : impl_->opts.lookup_timeout;
  TROUPE_TRY(impl_->agent->rpc_sync<void>(o, worker, fn_lookup, name));

  std::weak_ptr<impl> w = impl_;
  auto proxy =
      detail::make_remote_proxy(impl_->sys, std::weak_ptr<detail::proxy_sink>(impl_), worker, name);
  const std::uint64_t watch_id = impl_->next_id.fetch_add(1);
  {
    std::lock_guard lk(impl_->mu);
    impl_->proxies.emplace(
        watch_id, impl::proxy_entry{caf::actor_cast<caf::weak_actor_ptr>(proxy), worker, name});
  }
  // The owner tells us when the actor exits; until then the proxy lives.
  auto watched =
      impl_->agent->rpc_sync<void>(o, worker, fn_watch, detail::watch_request{name, watch_id});
  if (!watched) {
    {
      std::lock_guard lk(impl_->mu);
      impl_->proxies.erase(watch_id);
    }
    kill_proxy(caf::actor_cast<caf::weak_actor_ptr>(proxy), caf::exit_reason::user_shutdown);
    return std::move(watched).error();
  }
  return proxy;
}

expected<caf::actor> node::await_actor(std::string_view path, duration timeout) {
  auto until = deadline::after(timeout);
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    auto left = std::max(until.remaining(), duration(std::chrono::milliseconds(1)));
    auto a = remote_actor(path, std::min(left, impl_->opts.lookup_timeout));
    if (a || a.error().code() != errc::not_found || until.expired()) return a;
    std::this_thread::sleep_for(std::min<duration>(pause, until.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace troupe::actors
