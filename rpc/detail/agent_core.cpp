#include <troupe/rpc/detail/agent_core.hpp>

#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/hmac.hpp>
#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/rpc/detail/accept_pause.hpp>
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
  if (!core->opts_.tls.enabled()) core->opts_.tls = tls_config_from_env();
  if (core->opts_.tls.enabled()) {
    auto ctx = tls::context::make(core->opts_.tls);
    if (!ctx)
      return fail(make_error(ctx.error().code(), "worker '", core->name_,
                             "' cannot use TLS: ", ctx.error().message()));
    core->tls_ = std::move(*ctx);
  }
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
             ") serving on ", core->host_, ":", core->port_);
  return core;
}

expected<void> agent_core::start_io() {
  // Where to listen: the options' address, else this process's address for its job.
  if (opts_.listen_host.empty()) {
    auto here = local_address();
    if (!here)
      return make_error(here.error().code(), "worker '", name_,
                        "' cannot choose the address to listen on: ", here.error().message(),
                        " (or set rpc_backend_options::listen_host)");
    opts_.listen_host = *here;
  }
  try {
    asio::ip::tcp::resolver resolver(io_);
    auto eps = resolver.resolve(opts_.listen_host, std::to_string(opts_.listen_port),
                                asio::ip::tcp::resolver::passive);
    asio::ip::tcp::endpoint ep = eps.begin()->endpoint();
    acceptor_.emplace(io_);
    acceptor_->open(ep.protocol());
    acceptor_->set_option(asio::ip::tcp::acceptor::reuse_address(true));
    acceptor_->bind(ep);
    acceptor_->listen(asio::socket_base::max_listen_connections);
    host_ = acceptor_->local_endpoint().address().to_string();
    port_ = acceptor_->local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    return make_error(errc::unavailable, "cannot listen on ", opts_.listen_host, ":",
                      opts_.listen_port, ": ", e.what(), "; set options.listen_host/listen_port",
                      " (or TROUPE_LOCAL_ADDR) to an address of this host");
  }
  // Listening on every interface: the others are told this process's address for its job.
  if (acceptor_->local_endpoint().address().is_unspecified()) {
    auto here = local_address();
    if (!here)
      return make_error(
          here.error().code(), "worker '", name_, "' listens on ", host_,
          " but cannot tell which of its addresses to advertise: ", here.error().message());
    host_ = *here;
  }
  work_.emplace(io_.get_executor());
  listen_locally();
  // Accept loops: each accepted socket gets its own strand.
  auto accept = std::make_shared<std::function<void()>>();
  std::weak_ptr<agent_core> weak = weak_from_this();
  // TCP connections are TLS when the agent has an identity; local sockets stay plain.
  auto adopt = [this, weak](connection::socket_type sock, bool tcp) {
    std::unique_ptr<tls::session> tls;
    if (tcp) {
      auto s = new_tls_session(false);
      if (!s) {
        TROUPE_LOG(log_level::error, "rpc", "worker '", name_,
                   "' dropped a connection: ", s.error().message());
        return;
      }
      tls = std::move(*s);
    }
    auto c = std::make_shared<connection>(std::move(sock), weak, false, wire::limits{4096, 0, 0},
                                          opts_.max_queued_bytes, std::move(tls));
    {
      std::lock_guard<std::mutex> lk(conns_mu_);
      inbound_.insert(c);
    }
    c->start(std::chrono::seconds(10));
  };
  auto pause = std::make_shared<accept_pause>(io_);
  *accept = [this, weak, adopt, pause, accept_w = std::weak_ptr<std::function<void()>>(accept)] {
    acceptor_->async_accept(asio::make_strand(io_),
                            [this, weak, adopt, pause, accept_w](
                                const boost::system::error_code& ec, asio::ip::tcp::socket sock) {
                              auto self = weak.lock();
                              if (!self || stopping_.load() || ec == asio::error::operation_aborted)
                                return;
                              if (ec) return pause->retry_after_failure(ec, "rpc", accept_w);
                              pause->succeeded();
                              adopt(connection::socket_type(std::move(sock)), true);
                              if (auto again = accept_w.lock()) (*again)();
                            });
  };
  accept_loop_ = accept;
  (*accept)();
  if (local_acceptor_) {
    auto accept_local = std::make_shared<std::function<void()>>();
    auto local_pause = std::make_shared<accept_pause>(io_);
    *accept_local = [this, weak, adopt, local_pause,
                     again_w = std::weak_ptr<std::function<void()>>(accept_local)] {
      local_acceptor_->async_accept(
          asio::make_strand(io_),
          [this, weak, adopt, local_pause, again_w](const boost::system::error_code& ec,
                                                    asio::local::stream_protocol::socket sock) {
            auto self = weak.lock();
            if (!self || stopping_.load() || ec == asio::error::operation_aborted) return;
            if (ec) return local_pause->retry_after_failure(ec, "rpc (local socket)", again_w);
            local_pause->succeeded();
            adopt(connection::socket_type(std::move(sock)), false);
            if (auto again = again_w.lock()) (*again)();
          });
    };
    local_accept_loop_ = accept_local;
    (*accept_local)();
  }
  start_sweeper();
  std::size_t n = opts_.num_io_threads == 0 ? 1 : opts_.num_io_threads;
  for (std::size_t i = 0; i < n; ++i)
    io_threads_.emplace_back([this] {
      mark_io_thread();
      io_.run();
    });
  return ok();
}

void agent_core::start_sweeper() {
  sweeper_.emplace(io_);
  std::weak_ptr<agent_core> weak = weak_from_this();
  auto tick = std::make_shared<std::function<void()>>();
  *tick = [this, weak, tick_w = std::weak_ptr<std::function<void()>>(tick)] {
    sweeper_->expires_after(sweep_interval);
    sweeper_->async_wait([this, weak, tick_w](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || stopping_.load()) return;
      std::vector<std::shared_ptr<connection>> conns;
      std::vector<std::shared_ptr<connection>> accepted;
      {
        std::lock_guard<std::mutex> lk(conns_mu_);
        for (auto& [n, c] : outbound_) conns.push_back(c);
        accepted.assign(inbound_.begin(), inbound_.end());
      }
      auto now = clock::now();
      std::int64_t queued = 0;
      for (auto& c : conns) {
        c->expire(now);
        queued += static_cast<std::int64_t>(c->queued_bytes());
      }
      for (auto& c : accepted) queued += static_cast<std::int64_t>(c->queued_bytes());
      sample_send_queue(queued);
      expire_parked_fetches(now);
      (void)loans_.expire(now);
      if (auto t = tick_w.lock()) (*t)();
    });
  };
  sweep_loop_ = tick;
  asio::post(io_, [tick] { (*tick)(); });
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
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    auto it = outbound_.find(m.info.name);
    if (it != outbound_.end()) return it->second;  // possibly failed: its sticky error then
  }
  std::lock_guard<std::mutex> dial_lock(dial_mu_);
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    auto it = outbound_.find(m.info.name);
    if (it != outbound_.end()) return it->second;
  }
  auto c = dial(m, d);
  if (!c) return std::move(c).error();
  std::lock_guard<std::mutex> lk(conns_mu_);
  if (stopping_.load()) {
    (*c)->close(make_error(errc::shut_down, "the agent is shutting down"));
    return make_error(errc::shut_down, "worker '", name_, "' is shutting down");
  }
  outbound_[m.info.name] = *c;
  return *c;
}

// A loopback listener gets a local socket beside it; any failure only loses the fast path.
void agent_core::listen_locally() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host_, ec);
  if (!opts_.local_socket || ec || !addr.is_loopback()) return;
  asio::local::stream_protocol::endpoint ep(local_socket_name("rpc", host_, port_));
  local_acceptor_.emplace(io_);
  local_acceptor_->open(ep.protocol(), ec);
  if (!ec) local_acceptor_->bind(ep, ec);
  if (!ec) local_acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    TROUPE_LOG(log_level::debug, "rpc", "worker '", name_, "': no local socket (", ec.message(),
               "); peers on this host connect over TCP");
    local_acceptor_.reset();
  }
}

// Connects to a peer on this host through its local socket; null when it has none (the
// connect is refused at once) or this worker does not use them.
std::optional<connection::socket_type> agent_core::dial_locally(const member& m,
                                                                const asio::ip::address& addr) {
  if (!opts_.local_socket || !addr.is_loopback()) return std::nullopt;
  asio::local::stream_protocol::socket sock(asio::make_strand(io_));
  boost::system::error_code ec;
  sock.open(asio::local::stream_protocol(), ec);
  // A listening Unix socket accepts or refuses at once (a full backlog would make a
  // blocking connect wait, so it is non-blocking: EAGAIN falls back to TCP as well).
  if (!ec) sock.non_blocking(true, ec);
  if (!ec)
    sock.connect(asio::local::stream_protocol::endpoint(local_socket_name("rpc", m.host, m.port)),
                 ec);
  if (ec) return std::nullopt;
  sock.non_blocking(false, ec);
  return connection::socket_type(std::move(sock));
}

expected<std::shared_ptr<connection>> agent_core::dial(const member& m, deadline d) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(m.host, ec);
  if (ec)
    return make_error(errc::invalid_argument, "worker '", m.info.name, "' published address '",
                      m.host, "' that is not an IP address");
  if (auto local = dial_locally(m, addr)) return handshake(m, std::move(*local), nullptr, d);
  auto tls = new_tls_session(true);
  if (!tls) return std::move(tls).error();
  asio::ip::tcp::socket sock(asio::make_strand(io_));
  asio::ip::tcp::endpoint ep(addr, m.port);
  std::promise<boost::system::error_code> connected;
  auto fut = connected.get_future();
  sock.async_connect(ep,
                     [&connected](const boost::system::error_code& e) { connected.set_value(e); });
  if (fut.wait_until(d.time_point()) != std::future_status::ready) {
    asio::post(sock.get_executor(), [&sock] {
      boost::system::error_code ignored;
      sock.close(ignored);
    });
    fut.wait();
    return make_error(errc::timeout, "connecting to worker '", m.info.name, "' at ", m.host, ":",
                      m.port, " timed out")
        .with_worker(m.info.name);
  }
  if (auto e = fut.get())
    return make_error(errc::connection_lost, "cannot connect to worker '", m.info.name, "' at ",
                      m.host, ":", m.port, ": ", e.message(), "; the worker may have died")
        .with_worker(m.info.name);
  return handshake(m, connection::socket_type(std::move(sock)), std::move(*tls), d);
}

expected<std::unique_ptr<tls::session>> agent_core::new_tls_session(bool client) const {
  if (!tls_) return std::unique_ptr<tls::session>();
  return tls::session::make(tls_, client);
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
    {
      std::lock_guard<std::mutex> lk(conns_mu_);
      // Calls still waiting for their answer, and one-way frames not yet written.
      for (auto& [name, c] : outbound_) n += c->pending_count() + (c->queued_bytes() > 0 ? 1 : 0);
    }
    if (n == 0) return ok();
    if (d.expired())
      return make_error(errc::timeout, n,
                        " calls (or connections with one-way calls not yet written) of worker '",
                        name_, "' were still outstanding at the shutdown deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void agent_core::send_shutdown_notices() {
  std::vector<std::shared_ptr<connection>> all;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto& [n, c] : outbound_) all.push_back(c);
    for (auto& c : inbound_) all.push_back(c);
  }
  for (auto& c : all) {
    wire::frame_builder fb(wire::kind::shutdown, 0);
    if (fb.finish()) (void)c->send(std::move(fb));
  }
}

void agent_core::await_shutdown_notices(deadline d) {
  std::vector<std::shared_ptr<connection>> all;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto& [n, c] : outbound_) all.push_back(c);
    for (auto& c : inbound_) all.push_back(c);
  }
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
  std::vector<std::shared_ptr<connection>> all;
  {
    std::lock_guard<std::mutex> clk(conns_mu_);
    for (auto& [n, c] : outbound_) all.push_back(c);
    for (auto& c : inbound_) all.push_back(c);
  }
  for (auto& c : all) c->close(why);
  if (!io_threads_.empty()) {
    asio::post(io_, [this] {
      boost::system::error_code ec;
      if (acceptor_) acceptor_->close(ec);
      if (local_acceptor_) local_acceptor_->close(ec);
      if (sweeper_) sweeper_->cancel();
    });
  }
  if (pool_) pool_->stop(deadline::after(std::chrono::seconds(5)));
  work_.reset();
  // Let the strands run the closes, then stop.
  auto until = deadline::after(std::chrono::seconds(2));
  for (;;) {
    bool all_closed = true;
    for (auto& c : all)
      if (!c->sticky_error()) all_closed = false;
    if (all_closed || until.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  io_.stop();
  for (auto& t : io_threads_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  io_threads_.clear();
  rpc_stats().send_queue.add(-send_queue_sample_.exchange(0));
  {
    std::lock_guard<std::mutex> clk(conns_mu_);
    outbound_.clear();
    inbound_.clear();
  }
  accept_loop_.reset();
  local_accept_loop_.reset();
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
