// agent_core: the calling side (requests, remote-reference operations).
#include <troupe/core/log.hpp>
#include <troupe/core/trace.hpp>
#include <troupe/rpc/detail/agent_core.hpp>
#include <troupe/rpc/routing.hpp>

namespace troupe::rpc::detail {

wire::frame_builder agent_core::begin_request(std::string_view fn, std::uint8_t flags,
                                              std::uint64_t rref_id, duration timeout) {
  wire::frame_builder fb(wire::kind::request, next_call_.fetch_add(1, std::memory_order_relaxed));
  auto ms = static_cast<std::uint32_t>(std::min<std::int64_t>(timeout.count(), 0xffffffffLL));
  binary_serializer f(fb.message());
  (void)f(std::string(fn), flags, rref_id, ms);
  return fb;
}

std::uint64_t agent_core::next_rref_id() {
  auto creator = static_cast<std::uint64_t>(static_cast<std::uint32_t>(self_.id)) & 0xffffffu;
  return (creator << 40) | next_rref_.fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t call_flow_id(std::int32_t caller, std::uint64_t call) noexcept {
  return trace::flow_id(caller, call, trace::flow_channel::rpc);
}

namespace {

// Adds what came back to a call's span: the reply's bytes (message and tensors), or the
// error's message.
void add_reply(trace::args& a, const expected<wire::frame>& r) {
  if (r) {
    std::uint64_t back = r->message.size();
    for (const auto& t : r->tensors) back += t.nbytes();
    a.add("reply_bytes", back);
  } else {
    a.add("error", r.error().message());
  }
}

}  // namespace

future<wire::frame> agent_core::send_request(const worker_info& to, wire::frame_builder&& fb,
                                             duration timeout, bool expect_reply, write_mode mode,
                                             std::string_view fn) {
  if (fn.empty() || !trace::enabled())
    return send_request_now(to, std::move(fb), timeout, expect_reply, mode);
  const auto start = trace::now_ns();
  const auto tid = trace::thread_id();
  std::uint64_t bytes = fb.message().size() - wire::header_size;
  for (const auto& t : fb.tensors()) bytes += t.nbytes();
  trace::args a;
  a.add("function", fn).add("peer", to.name).add("call", fb.id()).add("bytes", bytes);
  const auto flow = call_flow_id(self_.id, fb.id());
  std::string name = "call ";  // not strcat: a string stream costs more than the event
  name += fn;
  return send_request_now(to, std::move(fb), timeout, expect_reply, mode)
      .handle([start, tid, a = std::move(a), flow,
               name = std::move(name)](expected<wire::frame>&& r) mutable -> expected<wire::frame> {
        add_reply(a, r);
        trace::complete("rpc", name, start, trace::now_ns(), a, {flow, 0}, tid);
        return std::move(r);
      });
}

future<wire::frame> agent_core::send_request_now(const worker_info& to, wire::frame_builder&& fb,
                                                 duration timeout, bool expect_reply,
                                                 write_mode mode) {
  auto context = [&](error e) {
    e.with_worker(to.name);
    return make_error_future<wire::frame>(std::move(e));
  };
  if (stopping_.load())
    return context(make_error(errc::shut_down, "worker '", name_, "' is shut down; no more calls"));
  device_map fwd;
  bool have_fwd = false;
  auto found = members_.get(to.name);
  if (!found) {
    auto f = find(worker_ref(to.name));
    return context(f ? make_error(errc::internal, "membership changed during the call")
                     : f.error());
  }
  member m = std::move(*found);
  if (auto it = opts_.device_maps.find(to.name); it != opts_.device_maps.end()) {
    fwd = it->second;
    have_fwd = true;
  }
  // One-way calls stage: nothing tells their sender when a lent tensor could be reused.
  if (auto p = prepare_outgoing(fb.tensors(), name_, to.name, have_fwd ? &fwd : nullptr,
                                route_kind::request, expect_reply ? lender_for(to.name) : nullptr);
      !p)
    return context(std::move(p).error());
  if (auto fin = fb.finish(opts_.limits); !fin) return context(std::move(fin).error());
  auto d = deadline::after(timeout);
  auto existing = transport_->opened(to.name);
  auto finish_send = [d, expect_reply, mode](const std::shared_ptr<connection>& c,
                                             wire::frame_builder&& b) {
    if (!expect_reply) {
      // Tensor views that own nothing must stay valid until the future is ready: that is
      // when their bytes are written, which may be after the frame was queued.
      bool borrowed = false;
      for (const auto& t : b.payload()) borrowed = borrowed || (!t.owner() && t.nbytes() > 0);
      if (!borrowed) {
        if (auto s = c->send(std::move(b), mode, d); !s)
          return make_error_future<wire::frame>(std::move(s).error());
        return make_ready_future(wire::frame{});
      }
      promise<void> written;
      auto done = written.get_future().then([] { return wire::frame{}; });
      if (auto s = c->send(std::move(b), mode, d, std::move(written)); !s)
        return make_error_future<wire::frame>(std::move(s).error());
      return done;
    }
    promise<wire::frame> p;
    auto fut = p.get_future();
    auto id = b.id();
    if (auto r = c->add_pending(id, std::move(p), d); !r)
      return make_error_future<wire::frame>(std::move(r).error());
    if (auto s = c->send(std::move(b), write_mode::now, d); !s)
      c->complete(id, std::move(s).error());
    return fut;
  };
  if (existing) return finish_send(existing, std::move(fb));
  if (is_io_thread()) {
    // Dialing blocks: do it on a worker thread, never on an I/O thread.
    promise<wire::frame> p;
    auto fut = p.get_future();
    auto task = [self = shared_from_this(), m, d, b = std::move(fb), p = std::move(p),
                 finish_send]() mutable {
      auto c = self->connection_to(m, d);
      if (!c) {
        p.set_error(std::move(c).error());
        return;
      }
      finish_send(*c, std::move(b))
          .on_complete(
              [p = std::move(p)](expected<wire::frame>&& r) mutable { p.set(std::move(r)); });
    };
    if (!pool_->post(std::move(task)))
      return context(make_error(errc::shut_down, "worker '", name_, "' is shut down"));
    return fut;
  }
  auto c = connection_to(m, d);
  if (!c) return context(std::move(c).error());
  return finish_send(*c, std::move(fb));
}

future<wire::frame> agent_core::fetch_rref(const worker_info& owner, std::uint64_t id,
                                           duration timeout) {
  auto c = transport_->opened(owner.name);
  if (!c)
    return make_error_future<wire::frame>(make_error(errc::peer_left, "the owner '", owner.name,
                                                     "' of remote reference ", id,
                                                     " is no longer connected")
                                              .with_worker(owner.name));
  wire::frame_builder fb(wire::kind::rref_fetch,
                         next_call_.fetch_add(1, std::memory_order_relaxed));
  (void)serialize(fb.message(), nullptr, id);
  (void)fb.finish();
  promise<wire::frame> p;
  auto fut = p.get_future();
  auto call_id = fb.id();
  const bool traced = trace::enabled();
  const std::int64_t start = traced ? trace::now_ns() : 0;
  if (auto r = c->add_pending(call_id, std::move(p), deadline::after(timeout)); !r)
    return make_error_future<wire::frame>(std::move(r).error());
  if (auto s = c->send(std::move(fb)); !s) c->complete(call_id, std::move(s).error());
  if (!traced) return fut;
  // The fetch's span, from the request leaving until the value (or the error) is back;
  // its arrow ends at the owner's "serve rref fetch" span.
  trace::args a;
  a.add("rref", id)
      .add("peer", owner.name)
      .add("call", call_id)
      .add("bytes", std::uint64_t{sizeof(id)});
  return std::move(fut).handle(
      [start, tid = trace::thread_id(), a = std::move(a), flow = call_flow_id(self_.id, call_id)](
          expected<wire::frame>&& r) mutable -> expected<wire::frame> {
        add_reply(a, r);
        trace::complete("rpc", "rref fetch", start, trace::now_ns(), a, {flow, 0}, tid);
        return std::move(r);
      });
}

void agent_core::release_rref(const worker_info& owner, std::uint64_t id, std::uint64_t fork) {
  auto c = transport_->opened(owner.name);
  if (!c || stopping_.load()) return;  // the owner is gone: so is the value
  wire::frame_builder fb(wire::kind::rref_release, 0);
  (void)serialize(fb.message(), nullptr, id, fork);
  if (fb.finish()) (void)c->send(std::move(fb));
}

void agent_core::add_rref_share(const worker_info& owner, std::uint64_t id, std::uint64_t fork,
                                const std::string& holder) {
  auto c = transport_->opened(owner.name);
  if (!c || stopping_.load()) {
    // The receiver will learn it from to_here (the owner is not connected).
    TROUPE_LOG(log_level::debug, "rpc", "remote reference ", id, " sent to '", holder,
               "' but its owner '", owner.name, "' is not connected");
    return;
  }
  wire::frame_builder fb(wire::kind::rref_add, 0);
  (void)serialize(fb.message(), nullptr, id, fork, holder);
  if (fb.finish()) (void)c->send(std::move(fb));
}

bool agent_core::connected_to(const std::string& w) const {
  return transport_->opened(w) != nullptr;
}

expected<std::uint64_t> agent_core::fork_rref(const std::shared_ptr<rref_holder>&) {
  return make_error(errc::unsupported, "worker '", name_,
                    "' cannot send a remote_ref here: only RPC "
                    "arguments and results carry remote references");
}

expected<std::shared_ptr<rref_holder>> agent_core::adopt_rref(const worker_info& owner,
                                                              std::uint64_t id,
                                                              std::uint64_t fork) {
  if (owner.name.empty() || fork == 0)
    return make_error(errc::protocol_error,
                      "a received remote reference names no owner or no fork");
  return std::make_shared<rref_holder>(shared_from_this(), owner, id,
                                       make_ready_future(wire::frame{}), true, fork);
}

expected<std::uint64_t> message_refs::fork_rref(const std::shared_ptr<rref_holder>& h) {
  if (receiver_.empty())
    return make_error(errc::unsupported,
                      "a remote_ref cannot be kept inside a remote value (agent::remote): "
                      "it has no single receiver; return it from rpc_sync/rpc_async instead");
  if (!h->counted())
    return make_error(errc::invalid_argument, "remote reference ", h->id(),
                      " cannot be sent: the call that should have created it was never sent "
                      "(call to_here on it for the reason)");
  if (!core_.connected_to(h->owner().name))
    return make_error(errc::unavailable, "remote reference ", h->id(),
                      " cannot be sent: its owner '", h->owner().name,
                      "' is not connected to this worker (it left or died, or has "
                      "just joined); fetch the value with to_here and send that instead")
        .with_worker(h->owner().name);
  auto fork = core_.next_rref_id();
  forks_.emplace_back(h, fork);
  return fork;
}

void message_refs::commit() {
  for (auto& [h, fork] : forks_) core_.add_rref_share(h->owner(), h->id(), fork, receiver_);
  forks_.clear();
}

}  // namespace troupe::rpc::detail
