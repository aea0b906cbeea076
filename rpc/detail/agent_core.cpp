#include <troupe/rpc/detail/agent_core.hpp>

#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/hmac.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/rpc/detail/rpc_metrics.hpp>
#include <troupe/store/connect.hpp>
#include <troupe/store/rendezvous.hpp>

namespace troupe::rpc::detail {

namespace {
constexpr auto sweep_interval = std::chrono::milliseconds(5);
}

agent_core::agent_core(std::string name, int rank, std::optional<int> world_size,
                       rpc_backend_options opts)
    : name_(std::move(name)),
      rank_(rank),
      world_size_(world_size),
      opts_(std::move(opts)),
      members_(name_, world_size_ ? group_kind::static_group : group_kind::dynamic_group) {
  self_ = worker_info{name_, world_size_ ? rank_ : -1};
  functions_ = opts_.functions ? opts_.functions : std::make_shared<function_table>();
}

agent_core::~agent_core() { stop_local(make_error(errc::shut_down, "the agent was destroyed")); }

expected<std::shared_ptr<agent_core>> agent_core::create(std::string name, int rank,
                                                         std::optional<int> world_size,
                                                         rpc_backend_options opts) {
  TROUPE_TRY(validate_worker_name(name));
  if (world_size && (*world_size < 1 || rank < 0 || rank >= *world_size))
    return make_error(errc::invalid_argument, "rank ", rank, " is not in a world of size ",
                      *world_size, "; ranks run from 0 to world_size - 1");
  if (opts.rpc_timeout <= duration::zero())
    return make_error(errc::invalid_argument, "rpc_timeout must be positive, got ",
                      format_duration(opts.rpc_timeout));
  if (opts.num_worker_threads == 0)
    return make_error(errc::invalid_argument, "num_worker_threads must be at least 1");
  auto core = std::shared_ptr<agent_core>(
      new agent_core(std::move(name), rank, world_size, std::move(opts)));
  auto d = deadline::after(core->opts_.init_timeout);
  auto fail = [&](error e) -> expected<std::shared_ptr<agent_core>> {
    core->stop_local(e);
    return std::move(e).with_worker(core->name_).with_operation("rpc init");
  };
  if (core->opts_.store) {
    core->store_ = core->opts_.store;
  } else {
    if (core->opts_.init_method.empty())
      return fail(make_error(errc::invalid_argument,
                             "no store to meet through: set options.init_method "
                             "(e.g. \"tcp://127.0.0.1:29500\") or options.store"));
    store_options so;
    so.timeout = core->opts_.init_timeout;
    so.connect_timeout = core->opts_.init_timeout;
    auto s = connect_store(core->opts_.init_method, so);
    if (!s) return fail(std::move(s).error());
    core->store_ = std::shared_ptr<store>(std::move(*s));
  }
  // The job's TLS identity for TCP connections: options.tls, else the TROUPE_TLS_CERT/KEY/CA
  // settings; none: plain.
  if (!core->opts_.tls.enabled()) core->opts_.tls = tls_config_from_env();
  transport::options to;
  to.worker = core->name_;
  to.listen_host = core->opts_.listen_host;
  to.listen_port = core->opts_.listen_port;
  to.local_socket = core->opts_.local_socket;
  to.io_threads = core->opts_.num_io_threads;
  to.max_queued_bytes = core->opts_.max_queued_bytes;
  if (core->opts_.tls.enabled()) {
    auto ctx = tls::context::make(core->opts_.tls);
    if (!ctx)
      return fail(make_error(ctx.error().code(), "worker '", core->name_,
                             "' cannot use TLS: ", ctx.error().message()));
    to.tls = std::move(*ctx);
  }
  core->transport_ = std::make_unique<transport>(std::move(to));
  if (core->opts_.device_count >= 0) {
    core->device_count_ = core->opts_.device_count;
  } else {
    auto n = cuda_device_count();
    core->device_count_ = n ? *n : 0;
  }
  core->pool_ =
      std::make_unique<worker_pool>(core->opts_.num_worker_threads, core->opts_.busy_poll);
  if (auto r = core->start_io(); !r) return fail(std::move(r).error());
  if (auto r = core->ensure_token(d); !r) return fail(std::move(r).error());
  auto joined = world_size ? core->init_static(d) : core->init_dynamic(d);
  if (!joined) return fail(std::move(joined).error());
  TROUPE_LOG(log_level::info, "rpc", "worker '", core->name_, "' (id ", core->self_.id,
             ") serving on ", core->transport_->host(), ":", core->transport_->port());
  return core;
}

expected<void> agent_core::start_io() {
  TROUPE_TRY(transport_->listen());
  transport_->start(weak_from_this(), std::chrono::seconds(10));
  start_sweeper();
  return ok();
}

void agent_core::start_sweeper() {
  sweeper_.emplace(transport_->io());
  std::weak_ptr<agent_core> weak = weak_from_this();
  auto tick = std::make_shared<std::function<void()>>();
  *tick = [this, weak, tick_w = std::weak_ptr<std::function<void()>>(tick)] {
    sweeper_->expires_after(sweep_interval);
    sweeper_->async_wait([this, weak, tick_w](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || stopping_.load()) return;
      auto now = clock::now();
      std::int64_t queued = 0;
      for (auto& c : transport_->all()) {
        if (c->outbound()) c->expire(now);
        queued += static_cast<std::int64_t>(c->queued_bytes());
      }
      sample_send_queue(queued);
      expire_parked_fetches(now);
      (void)loans_.expire(now);
      if (auto t = tick_w.lock()) (*t)();
    });
  };
  sweep_loop_ = tick;
  asio::post(transport_->io(), [tick] { (*tick)(); });
}

void agent_core::sample_send_queue(std::int64_t queued) {
  rpc_stats().send_queue.add(queued - send_queue_sample_.exchange(queued));
  // A stop that ran meanwhile took this agent's share out already: take out the rest.
  if (stopping_.load()) rpc_stats().send_queue.add(-send_queue_sample_.exchange(0));
}

std::vector<worker_info> agent_core::workers() const { return members_.infos(); }

expected<worker_info> agent_core::find(const worker_ref& w) const { return members_.find(w); }

device_setup agent_core::setup() const { return members_.setup(); }

expected<std::shared_ptr<connection>> agent_core::connection_to(const member& m, deadline d) {
  return transport_->connect({m.info.name, m.host, m.port}, d, handshake_with(m));
}

expected<std::shared_ptr<connection>> agent_core::dial(const member& m, deadline d) {
  return transport_->dial({m.info.name, m.host, m.port}, d, handshake_with(m));
}

transport::handshake_fn agent_core::handshake_with(const member& m) {
  return [this, m](connection::socket_type sock, std::unique_ptr<tls::session> tls, deadline d) {
    return handshake(m, std::move(sock), std::move(tls), d);
  };
}

expected<std::shared_ptr<connection>> agent_core::handshake(const member& m,
                                                            connection::socket_type sock,
                                                            std::unique_ptr<tls::session> tls,
                                                            deadline d) {
  auto c = std::make_shared<connection>(std::move(sock), weak_from_this(), true, opts_.limits,
                                        opts_.max_queued_bytes, std::move(tls));
  c->set_peer(m.info);
  c->start(duration::zero());
  // hello (our nonce) -> challenge (its nonce and proof) -> our proof -> handshake_ok.
  // Each side proves the job token over both nonces; the token never travels.
  auto exchange = [&](wire::frame_builder&& out) -> expected<wire::frame> {
    promise<wire::frame> p;
    auto reply = p.get_future();
    TROUPE_TRY(c->add_pending(0, std::move(p), d));
    if (auto s = c->send(std::move(out)); !s) return std::move(s).error();
    return reply.get(d.remaining() + std::chrono::milliseconds(50));
  };
  auto fail = [&](error e) -> expected<std::shared_ptr<connection>> {
    c->close(e);
    return e;
  };
  auto nonce = make_nonce();
  if (!nonce) return fail(std::move(nonce).error());
  const std::string mine(reinterpret_cast<const char*>(nonce->data()), nonce->size());
  wire::frame_builder hs(wire::kind::handshake, 0);
  std::uint32_t protocol = wire::version;
  TROUPE_TRY(serialize(hs.message(), nullptr, protocol, mine, self_, opts_.group));
  TROUPE_TRY(hs.finish());
  auto challenge = exchange(std::move(hs));
  if (!challenge) return fail(std::move(challenge).error());
  std::string theirs, proof;
  if (challenge->type != wire::kind::handshake_challenge ||
      !deserialize(challenge->message, nullptr, theirs, proof))
    return fail(make_error(errc::protocol_error, "worker '", m.info.name, "' at ", m.host, ":",
                           m.port,
                           " did not answer the handshake with a challenge; is it a troupe RPC "
                           "agent of this version?")
                    .with_worker(m.info.name));
  auto want = wire::handshake_proof("acceptor", token_, mine, theirs, opts_.group, self_.name);
  if (!equal_constant_time(std::as_bytes(std::span(want.data(), want.size())),
                           std::as_bytes(std::span(proof.data(), proof.size()))))
    return fail(make_error(errc::unauthorized, "the worker at ", m.host, ":", m.port,
                           " claiming to be '", m.info.name,
                           "' could not prove this job's token: another job's worker, "
                           "or a different job secret (TROUPE_JOB_SECRET) or job_token")
                    .with_worker(m.info.name));
  wire::frame_builder answer(wire::kind::handshake_auth, 0);
  TROUPE_TRY(
      serialize(answer.message(), nullptr,
                wire::handshake_proof("caller", token_, mine, theirs, opts_.group, self_.name)));
  TROUPE_TRY(answer.finish());
  auto r = exchange(std::move(answer));
  if (!r) return fail(std::move(r).error());
  return c;
}

expected<void> agent_core::wait_outstanding(deadline d) {
  for (;;) {
    std::size_t n = 0;
    // Calls still waiting for their answer, and one-way frames not yet written.
    for (auto& c : transport_->opened_all())
      n += c->pending_count() + (c->queued_bytes() > 0 ? 1 : 0);
    if (n == 0) return ok();
    if (d.expired())
      return make_error(errc::timeout, n,
                        " calls (or connections with one-way calls not yet written) of worker '",
                        name_, "' were still outstanding at the shutdown deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void agent_core::send_shutdown_notices() {
  auto all = transport_->all();
  for (auto& c : all) {
    wire::frame_builder fb(wire::kind::shutdown, 0);
    if (fb.finish()) (void)c->send(std::move(fb));
  }
}

void agent_core::await_shutdown_notices(deadline d) {
  auto all = transport_->all();
  for (;;) {
    bool all_seen = true;
    for (auto& c : all)  // connections that never identified their peer get no notice
      if (!c->shutdown_notice_seen() && !c->sticky_error() && !c->peer().name.empty())
        all_seen = false;
    if (all_seen || d.expired()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void agent_core::stop_local(const error& why) {
  std::lock_guard<std::mutex> lk(lifecycle_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true);
  if (!transport_) {  // create() failed before the transport existed
    if (pool_) pool_->stop(deadline::after(std::chrono::seconds(5)));
    return;
  }
  transport_->stop_accepting();
  auto all = transport_->all();
  for (auto& c : all) c->close(why);
  if (sweeper_) asio::post(transport_->io(), [this] { sweeper_->cancel(); });
  if (pool_) pool_->stop(deadline::after(std::chrono::seconds(5)));
  // Let the strands run the closes, then stop.
  auto until = deadline::after(std::chrono::seconds(2));
  for (;;) {
    bool all_closed = true;
    for (auto& c : all)
      if (!c->sticky_error()) all_closed = false;
    if (all_closed || until.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  transport_->stop();
  rpc_stats().send_queue.add(-send_queue_sample_.exchange(0));
  sweep_loop_.reset();
}

expected<void> agent_core::shutdown(duration timeout) {
  {
    std::lock_guard<std::mutex> lk(lifecycle_mu_);
    if (stopped_) return stop_result_ ? expected<void>(*stop_result_) : ok();
  }
  auto d = deadline::after(timeout);
  expected<void> result;
  if (dynamic()) {
    result = leave(timeout);
  } else {
    auto waited = wait_outstanding(d);
    auto b = barrier(*store_, strcat(opts_.group, "/shutdown"), rank_, *world_size_, d.remaining());
    send_shutdown_notices();
    // One-way calls the others sent us before their notice are read before we close.
    await_shutdown_notices(
        deadline(std::min(d.time_point(), clock::now() + std::chrono::seconds(2))));
    if (!waited)
      result = std::move(waited).error();
    else if (!b)
      result = std::move(b).error();
    stop_local(make_error(errc::peer_left, "worker '", name_, "' shut down"));
  }
  std::lock_guard<std::mutex> lk(lifecycle_mu_);
  if (!result) stop_result_ = result.error();
  return result;
}

ipc_lender* agent_core::lender_for(const std::string& peer) {
  if (!opts_.cuda_ipc || device_count_ <= 0 || !members_.same_host(peer)) return nullptr;
  return &loans_;
}

void agent_core::release_loan(std::uint64_t id) {
  auto self = shared_from_this();
  if (!pool_ || !pool_->post([self, id] { (void)self->loans_.release(id); }))
    (void)loans_.release(id);
}

std::function<void(std::uint64_t)> agent_core::releaser(const std::shared_ptr<connection>& c) {
  return [c](std::uint64_t id) {
    wire::frame_builder fb(wire::kind::ipc_release, id);
    if (fb.finish()) (void)c->send(std::move(fb));
  };
}

std::optional<device_map> agent_core::reverse_map_for(const std::string& caller) const {
  return members_.reverse_map_for(caller);
}

}  // namespace troupe::rpc::detail
