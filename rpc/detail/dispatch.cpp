// agent_core: what happens to each received frame.
#include <troupe/core/hmac.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/rpc/detail/agent_core.hpp>
#include <troupe/rpc/detail/rpc_metrics.hpp>
#include <troupe/rpc/routing.hpp>

namespace troupe::rpc::detail {

namespace {

bool same_proof(std::string_view a, std::string_view b) {
  return equal_constant_time(std::as_bytes(std::span(a.data(), a.size())),
                             std::as_bytes(std::span(b.data(), b.size())));
}

}  // namespace

void agent_core::on_frame(const std::shared_ptr<connection>& c, wire::frame&& f) {
  using wire::kind;
  if (!c->outbound()) {
    if (c->peer().name.empty()) {
      if (f.type == kind::handshake && !c->challenge_state())
        return handle_handshake(c, std::move(f));
      if (f.type == kind::handshake_auth && c->challenge_state())
        return handle_handshake_auth(c, std::move(f));
      return c->close(make_error(errc::protocol_error, "connection from ", c->remote_address(),
                                 " sent a ", wire::to_string(f.type),
                                 " frame before its handshake"));
    }
    switch (f.type) {
      case kind::request:
        return handle_request(c, std::move(f));
      case kind::rref_fetch:
      case kind::rref_add:
      case kind::rref_release:
        return handle_rref(c, std::move(f));
      case kind::membership: {
        auto self = shared_from_this();
        auto task = [self, c, fr = std::move(f)]() mutable {
          self->handle_membership(c, std::move(fr));
        };
        if (!pool_->post(std::move(task)))
          reply_error(c, 0, make_error(errc::shut_down, "worker '", name_, "' is shutting down"));
        return;
      }
      case kind::ipc_release:
        return release_loan(f.id);
      case kind::shutdown: {
        c->note_shutdown_notice();
        if (auto opened = transport_->opened(c->peer().name)) opened->mark_peer_leaving();
        return;
      }
      default:
        return c->close(make_error(errc::protocol_error, "worker '", c->peer().name, "' sent a ",
                                   wire::to_string(f.type), " frame on a connection it opened"));
    }
  }
  switch (f.type) {
    case kind::handshake_ok:
    case kind::handshake_challenge:
    case kind::response:
    case kind::error:
      return handle_response(c, std::move(f));
    case kind::shutdown:
      c->note_shutdown_notice();
      return;
    case kind::ipc_release:
      return release_loan(f.id);
    default:
      return c->close(make_error(errc::protocol_error, "worker '", c->peer().name, "' sent a ",
                                 wire::to_string(f.type), " frame on a connection we opened"));
  }
}

void agent_core::on_closed(const std::shared_ptr<connection>& c, const error& why) {
  auto peer = c->peer().name;
  transport_->forget(c, dynamic() && !peer.empty());
  // Only the loss of a connection we opened means the peer died: an inbound connection
  // also closes when its peer merely forgets us (after we left).
  if (stopping_.load() || leaving_.load() || peer.empty() || !c->outbound() ||
      why.code() != errc::connection_lost)
    return;
  if (dynamic() && !opts_.membership_tag.empty()) {
    // The job's membership decides: the worker stays a member until expel() takes it out.
    auto known = members_.get(peer);
    if (!known || peer == name_) return;
    auto info = known->info;
    TROUPE_LOG(log_level::warn, "rpc", "worker '", peer, "' is unreachable (", why.message(),
               "); it stays a member until the job's membership takes it out");
    notify_membership({membership_change::unreachable, info, why});
    return;
  }
  // Whatever the dead worker held of our remote references is released.
  drop_rref_shares_of(peer);
  if (!dynamic()) {
    // A static group keeps its members; listeners still learn that this one is gone.
    notify_membership({membership_change::failed, c->peer(), why});
    return;
  }
  // A member of a dynamic group that vanished without leaving: drop it here. The store
  // entry is cleaned up by the next worker that joins.
  if (!members_.remove(peer)) return;
  TROUPE_LOG(log_level::warn, "rpc", "worker '", peer, "' vanished (", why.message(),
             "); removed it from the group");
  notify_membership({membership_change::failed, c->peer(), why});
}

void agent_core::refuse_handshake(const std::shared_ptr<connection>& c, const error& why) {
  TROUPE_LOG(log_level::warn, "rpc", why.message());
  reply_error(c, 0, why);
  c->close(why);
}

// The caller's hello: who it claims to be and its nonce. Answered with our nonce and our
// proof of the job token; the caller proves it in turn (handle_handshake_auth). The token
// itself never travels.
void agent_core::handle_handshake(const std::shared_ptr<connection>& c, wire::frame&& f) {
  std::uint32_t protocol = 0;
  std::string nonce, group;
  worker_info who;
  auto r = deserialize(f.message, nullptr, protocol, nonce, who, group);
  if (!r)
    return refuse_handshake(
        c, make_error(errc::protocol_error, "malformed handshake: ", r.error().message()));
  if (protocol != wire::version)
    return refuse_handshake(c, make_error(errc::protocol_error, "protocol version ", protocol,
                                          " is not ", int(wire::version)));
  if (who.name.empty())
    return refuse_handshake(c, make_error(errc::protocol_error, "handshake without a worker name"));
  if (nonce.size() < 16)
    return refuse_handshake(c, make_error(errc::protocol_error, "handshake nonce of ", nonce.size(),
                                          " bytes; at least 16 are required"));
  auto mine = make_nonce();
  if (!mine) return refuse_handshake(c, mine.error());
  connection::pending_handshake p{
      who, group, std::move(nonce),
      std::string(reinterpret_cast<const char*>(mine->data()), mine->size())};
  wire::frame_builder ch(wire::kind::handshake_challenge, 0);
  std::string proof =
      wire::handshake_proof("acceptor", token_, p.caller_nonce, p.acceptor_nonce, group, who.name);
  if (!serialize(ch.message(), nullptr, p.acceptor_nonce, proof) || !ch.finish())
    return refuse_handshake(c, make_error(errc::protocol_error, "cannot encode the challenge"));
  c->challenge_state() = std::move(p);
  (void)c->send(std::move(ch));
}

void agent_core::handle_handshake_auth(const std::shared_ptr<connection>& c, wire::frame&& f) {
  auto p = std::move(*c->challenge_state());
  c->challenge_state().reset();
  std::string proof;
  if (auto r = deserialize(f.message, nullptr, proof); !r)
    return refuse_handshake(
        c, make_error(errc::protocol_error, "malformed handshake proof: ", r.error().message()));
  if (!same_proof(proof, wire::handshake_proof("caller", token_, p.caller_nonce, p.acceptor_nonce,
                                               p.group, p.who.name)))
    return refuse_handshake(
        c, make_error(errc::unauthorized, "worker '", name_, "' refused a connection from ",
                      c->remote_address(), " claiming to be '", p.who.name,
                      "': it could not prove the job token; every worker of a job must use the "
                      "same job secret (TROUPE_JOB_SECRET), job_token or store"));
  worker_info who = std::move(p.who);
  c->set_peer(who);
  c->set_limits(opts_.limits);
  wire::frame_builder ok_frame(wire::kind::handshake_ok, 0);
  (void)serialize(ok_frame.message(), nullptr, self_);
  if (ok_frame.finish()) (void)c->send(std::move(ok_frame));
}

void agent_core::reply_error(const std::shared_ptr<connection>& c, std::uint64_t id, error e) {
  wire::frame_builder fb(wire::kind::error, id);
  if (!serialize(fb.message(), nullptr, e) || !fb.finish()) return;
  (void)c->send(std::move(fb));
}

void agent_core::handle_response(const std::shared_ptr<connection>& c, wire::frame&& f) {
  if (f.type == wire::kind::error) {
    error e;
    if (auto r = deserialize(f.message, nullptr, e); !r)
      e = make_error(errc::protocol_error, "worker '", c->peer().name,
                     "' sent a malformed error: ", r.error().message());
    c->complete(f.id, std::move(e));
    return;
  }
  if (!needs_placement(f.tensors)) {
    c->complete(f.id, std::move(f));
    return;
  }
  // GPU tensors are placed on a worker thread: CUDA waits never run on an I/O thread.
  auto task = [self = shared_from_this(), c, fr = std::move(f)]() mutable {
    auto placed = place_incoming(fr.tensors, self->name_, self->device_count_, releaser(c));
    auto id = fr.id;
    if (!placed)
      c->complete(id, std::move(placed).error());
    else
      c->complete(id, std::move(fr));
  };
  if (!pool_->post(std::move(task)))
    c->complete(f.id, make_error(errc::shut_down, "worker '", name_, "' is shutting down"));
}

void agent_core::handle_request(const std::shared_ptr<connection>& c, wire::frame&& f) {
  rpc_stats().server_calls.add();
  std::string fn_name;
  std::uint8_t flags = 0;
  std::uint64_t rref_id = 0;
  std::uint32_t timeout_ms = 0;
  binary_deserializer d(f.message);
  if (auto e = d(fn_name, flags, rref_id, timeout_ms)) {
    reply_error(c, f.id,
                make_error(errc::protocol_error, "malformed request: ", e.err().message()));
    return;
  }
  const bool no_reply = flags & request_no_reply;
  std::size_t args_offset = f.message.size() - d.remaining();
  if (fn_name == ping_function) {
    // The answer carries this host's clock, for the caller's clock-offset estimate.
    wire::frame_builder fb(wire::kind::response, f.id);
    (void)serialize(fb.message(), nullptr, trace::now_ns());
    if (fb.finish()) (void)c->send(std::move(fb));
    return;
  }
  if (flags & request_as_remote) {
    // The entry exists from now on, with the creator's share (fork 0).
    rrefs_.created(rref_id, c->peer().name);
  }
  auto fn = functions_->find(fn_name);
  if (!fn) {
    auto names = functions_->names();
    std::string list;
    for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
    auto e = make_error(errc::not_found, "worker '", name_, "' has no function called '", fn_name,
                        "' (it serves: ", list.empty() ? "nothing" : list,
                        "); register it there before calling it")
                 .with_worker(name_);
    if (flags & request_as_remote) store_rref_value(rref_id, e);
    if (no_reply)
      TROUPE_LOG(log_level::warn, "rpc", "dropped a one-way call from '", c->peer().name,
                 "': ", e.message());
    else
      reply_error(c, f.id, std::move(e));
    return;
  }
  call_info info{c->peer(), fn_name, f.id};
  auto until = deadline::after(duration(timeout_ms));
  if (fn->options.run_inline && !needs_placement(f.tensors)) {
    run_request(c, std::move(fn), std::move(info), f.id, flags, rref_id, until, std::move(f),
                args_offset);
    return;
  }
  auto id = f.id;
  auto task = [self = shared_from_this(), c, fn = std::move(fn), info = std::move(info), id, flags,
               rref_id, until, fr = std::move(f), args_offset]() mutable {
    self->run_request(c, std::move(fn), std::move(info), id, flags, rref_id, until, std::move(fr),
                      args_offset);
  };
  if (!pool_->post(std::move(task)))
    reply_error(
        c, id,
        make_error(errc::shut_down, "worker '", name_, "' is shutting down").with_worker(name_));
}

void agent_core::run_request(const std::shared_ptr<connection>& c,
                             std::shared_ptr<const function_table::entry> fn, call_info info,
                             std::uint64_t id, std::uint8_t flags, std::uint64_t rref_id,
                             deadline d, wire::frame&& f, std::size_t args_offset) {
  const bool as_remote = flags & request_as_remote;
  const bool no_reply = flags & request_no_reply;
  const std::string label = trace::enabled() ? "serve " + info.function : std::string();
  trace::span traced("rpc", label);
  if (traced.on()) {
    std::uint64_t bytes = f.message.size();
    for (const auto& t : f.tensors) bytes += t.nbytes();
    traced.args()
        .add("function", info.function)
        .add("peer", info.caller.name)
        .add("call", id)
        .add("bytes", bytes);
    traced.set_flow({0, call_flow_id(info.caller.id, id)});
  }
  auto fail = [&](error e) {
    if (traced.on()) traced.args().add("error", e.message());
    traced.end();  // before the answer leaves: the span lies inside the caller's
    e.with_worker(name_);
    e.with_operation(strcat("rpc '", info.function, "'"));
    if (as_remote) store_rref_value(rref_id, e);
    if (no_reply) {
      TROUPE_LOG(log_level::debug, "rpc", "a one-way call from '", info.caller.name,
                 "' failed: ", e.to_string());
      return;
    }
    reply_error(c, id, std::move(e));
  };
  if (d.expired())
    return fail(make_error(errc::timeout, "the call to '", info.function, "' waited in worker '",
                           name_, "''s queue past its deadline; the worker is overloaded"));
  if (needs_placement(f.tensors))
    if (auto placed = place_incoming(f.tensors, name_, device_count_, releaser(c)); !placed)
      return fail(std::move(placed).error());
  wire::frame_builder reply(wire::kind::response, id);
  // References received among the arguments become this worker's shares; references in
  // the result become the caller's (announced just before the reply is sent).
  message_refs refs(*this, as_remote ? std::string() : info.caller.name);
  incoming_call ic{&info,
                   std::span<const std::byte>(f.message).subspan(args_offset),
                   &f.tensors,
                   &reply.message(),
                   &reply.tensors(),
                   &refs};
  expected<void> r;
  try {
    r = fn->fn(ic);
  } catch (const exception& e) {
    r = e.err();
  } catch (const std::exception& e) {
    r = make_error(errc::user_error, e.what());
  } catch (...) {
    r = make_error(errc::user_error, "the function threw a non-standard exception");
  }
  if (!r) return fail(std::move(r).error());
  if (no_reply) return;
  if (as_remote) {
    wire::frame value;
    value.type = wire::kind::response;
    value.message.assign(reply.message().begin() + wire::header_size, reply.message().end());
    value.tensors = std::move(reply.tensors());
    store_rref_value(rref_id, std::move(value));
    wire::frame_builder ack(wire::kind::response, id);
    traced.end();
    if (ack.finish()) (void)c->send(std::move(ack));
    return;
  }
  std::optional<device_map> back;
  if (!reply.tensors().empty()) back = reverse_map_for(info.caller.name);
  if (auto p = prepare_outgoing(
          reply.tensors(), name_, info.caller.name, back ? &*back : nullptr, route_kind::reply,
          needs_placement(reply.tensors()) ? lender_for(info.caller.name) : nullptr);
      !p)
    return fail(std::move(p).error());
  if (auto fin = reply.finish(opts_.limits); !fin) return fail(std::move(fin).error());
  refs.commit();
  traced.end();
  (void)c->send(std::move(reply));
}

void agent_core::store_rref_value(std::uint64_t id, expected<wire::frame> value) {
  for (const auto& w : rrefs_.set_value(id, value)) answer_fetch(w, id, value);
}

void agent_core::answer_fetch(const rref_waiter& w, std::uint64_t id,
                              const expected<wire::frame>& value) {
  // The owner's side of a fetch: from its arrival (a parked fetch waited for the value
  // meanwhile) until just before the answer leaves; the fetcher's arrow ends here.
  auto traced = [&](std::string_view error, std::uint64_t bytes) {
    if (w.since_ns == 0 || !trace::enabled()) return;
    trace::args a;
    a.add("rref", id).add("peer", w.c->peer().name).add("call", w.req).add("bytes", bytes);
    if (!error.empty()) a.add("error", error);
    trace::complete("rpc", "serve rref fetch", w.since_ns, trace::now_ns(), a,
                    {0, call_flow_id(w.c->peer().id, w.req)});
  };
  if (!value) {
    traced(value.error().message(), 0);
    return reply_error(w.c, w.req, value.error());
  }
  wire::frame_builder fb(wire::kind::response, w.req);
  fb.message().insert(fb.message().end(), value->message.begin(), value->message.end());
  fb.tensors() = value->tensors;
  // A GPU value goes back through the fetcher's reverse map, as a call's result does.
  const auto& fetcher = w.c->peer().name;
  std::optional<device_map> back;
  if (needs_placement(fb.tensors())) back = reverse_map_for(fetcher);
  if (auto p = prepare_outgoing(fb.tensors(), name_, fetcher, back ? &*back : nullptr,
                                route_kind::reply, back ? lender_for(fetcher) : nullptr);
      !p) {
    traced(p.error().message(), 0);
    return reply_error(w.c, w.req, std::move(p).error());
  }
  std::uint64_t bytes = value->message.size();
  for (const auto& t : fb.tensors()) bytes += t.nbytes();
  traced({}, bytes);
  if (fb.finish(opts_.limits)) (void)w.c->send(std::move(fb));
}

void agent_core::handle_rref(const std::shared_ptr<connection>& c, wire::frame&& f) {
  std::uint64_t id = 0;
  std::uint64_t fork = 0;
  std::string holder;
  binary_deserializer d(f.message);
  inspect_error e;
  switch (f.type) {
    case wire::kind::rref_add:
      e = d(id, fork, holder);
      break;
    case wire::kind::rref_release:
      e = d(id, fork);
      break;
    default:
      e = d(id);
  }
  if (e || d.remaining() != 0) {
    if (f.type == wire::kind::rref_fetch)
      return reply_error(c, f.id,
                         make_error(errc::protocol_error, "malformed ", wire::to_string(f.type)));
    return c->close(make_error(errc::protocol_error, "worker '", c->peer().name,
                               "' sent a malformed ", wire::to_string(f.type)));
  }
  switch (f.type) {
    case wire::kind::rref_release:
      rrefs_.release(id, fork);
      return;
    case wire::kind::rref_add:
      rrefs_.add_share(id, fork, std::move(holder));
      return;
    default: {  // rref_fetch
      const rref_waiter w{c, f.id, trace::enabled() ? trace::now_ns() : 0};
      auto value = rrefs_.fetch(id, w);
      if (!value) return;  // it waits for the value (or for the request that creates it)
      if (*value && needs_placement((*value)->tensors)) {
        // Staging or lending GPU tensors waits on CUDA: not on an I/O thread.
        auto self = shared_from_this();
        if (pool_->post([self, w, id, v = *value] { self->answer_fetch(w, id, v); })) return;
      }
      answer_fetch(w, id, *value);
    }
  }
}

void agent_core::expire_parked_fetches(clock::time_point now) {
  for (auto& [id, waiters] : rrefs_.expire_parked(now, opts_.rpc_timeout)) {
    const expected<wire::frame> gone =
        make_error(errc::not_found, "remote reference ", id, " is not held by worker '", name_,
                   "': no call created it within ", format_duration(opts_.rpc_timeout),
                   ", and nobody holds a share")
            .with_worker(name_);
    for (const auto& w : waiters) answer_fetch(w, id, gone);
  }
}

void agent_core::drop_rref_shares_of(const std::string& worker) {
  auto [dropped, freed] = rrefs_.drop_shares_of(worker);
  if (dropped > 0)
    TROUPE_LOG(log_level::info, "rpc", "dropped ", dropped, " remote-reference shares held by '",
               worker, "' (gone); freed ", freed, " values");
}

std::size_t agent_core::owned_rrefs() const { return rrefs_.size(); }

}  // namespace troupe::rpc::detail
