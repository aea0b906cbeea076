#include <troupe/rpc/detail/transport.hpp>

#include <future>

#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/net/accept_backoff.hpp>
#include <troupe/net/local_listener.hpp>

namespace troupe::rpc::detail {

transport::transport(options o) : opts_(std::move(o)) {}

transport::~transport() {
  stop_accepting();
  stop();
}

expected<void> transport::listen() {
  // Where to listen: the options' address, else this process's address for its job.
  if (opts_.listen_host.empty()) {
    auto here = local_address();
    if (!here)
      return make_error(here.error().code(), "worker '", opts_.worker,
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
          here.error().code(), "worker '", opts_.worker, "' listens on ", host_,
          " but cannot tell which of its addresses to advertise: ", here.error().message());
    host_ = *here;
  }
  listen_locally();
  return ok();
}

void transport::listen_locally() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host_, ec);
  if (!opts_.local_socket || ec) return;
  local_acceptor_ =
      net::listen_beside(io_, "rpc", addr, port_, "rpc", strcat("worker '", opts_.worker, "'"));
}

expected<std::unique_ptr<tls::session>> transport::new_tls_session(bool client) const {
  if (!opts_.tls) return std::unique_ptr<tls::session>();
  return tls::session::make(opts_.tls, client);
}

// TCP connections are TLS when the job has an identity; local sockets stay plain.
void transport::adopt(connection::socket_type sock, bool tcp) {
  std::unique_ptr<tls::session> tls;
  if (tcp) {
    auto s = new_tls_session(false);
    if (!s) {
      TROUPE_LOG(log_level::error, "rpc", "worker '", opts_.worker,
                 "' dropped a connection: ", s.error().message());
      return;
    }
    tls = std::move(*s);
  }
  auto c = std::make_shared<connection>(std::move(sock), owner_, false, wire::limits{4096, 0, 0},
                                        opts_.max_queued_bytes, std::move(tls));
  {
    std::lock_guard<std::mutex> lk(mu_);
    accepted_.insert(c);
  }
  c->start(handshake_timeout_);
}

void transport::start(std::weak_ptr<connection_owner> owner, duration handshake_timeout) {
  owner_ = std::move(owner);
  handshake_timeout_ = handshake_timeout;
  work_.emplace(io_.get_executor());
  accept_on(*acceptor_, "rpc", true, accept_loop_);
  if (local_acceptor_) accept_on(*local_acceptor_, "rpc (local socket)", false, local_accept_loop_);
  std::size_t n = opts_.io_threads == 0 ? 1 : opts_.io_threads;
  for (std::size_t i = 0; i < n; ++i)
    threads_.emplace_back([this] {
      mark_io_thread();
      io_.run();
    });
  running_.store(true);
}

// Accepts on `from` until it closes, each accepted socket on its own strand, TLS when
// `tcp` and the job has an identity. The loop lives in `keep` (stop() drops it); its
// handlers run on the I/O threads, which stop() joins before this object goes.
template <class Acceptor>
void transport::accept_on(Acceptor& from, const char* what, bool tcp,
                          std::shared_ptr<std::function<void()>>& keep) {
  auto loop = std::make_shared<std::function<void()>>();
  auto pause = std::make_shared<net::accept_backoff>(io_, "rpc", what);
  *loop = [this, &from, tcp, pause, again_w = std::weak_ptr<std::function<void()>>(loop)] {
    from.async_accept(asio::make_strand(io_),
                      [this, tcp, pause, again_w](const boost::system::error_code& ec,
                                                  typename Acceptor::protocol_type::socket sock) {
                        if (closing_.load() || ec == asio::error::operation_aborted) return;
                        auto again = [again_w] {
                          if (auto fn = again_w.lock()) (*fn)();
                        };
                        if (ec) {
                          (void)pause->retry_after_failure(ec, again);
                          return;
                        }
                        pause->succeeded();
                        adopt(connection::socket_type(std::move(sock)), tcp);
                        again();
                      });
  };
  keep = loop;
  (*loop)();
}

std::optional<connection::socket_type> transport::dial_locally(const address& to,
                                                               const asio::ip::address& addr) {
  if (!opts_.local_socket || !addr.is_loopback()) return std::nullopt;
  asio::local::stream_protocol::socket sock(asio::make_strand(io_));
  boost::system::error_code ec;
  sock.open(asio::local::stream_protocol(), ec);
  // A listening Unix socket accepts or refuses at once (a full backlog would make a
  // blocking connect wait, so it is non-blocking: EAGAIN falls back to TCP as well).
  if (!ec) sock.non_blocking(true, ec);
  if (!ec)
    sock.connect(asio::local::stream_protocol::endpoint(local_socket_name("rpc", to.host, to.port)),
                 ec);
  if (ec) return std::nullopt;
  sock.non_blocking(false, ec);
  return connection::socket_type(std::move(sock));
}

expected<std::shared_ptr<connection>> transport::dial(const address& to, deadline d,
                                                      const handshake_fn& hs) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(to.host, ec);
  if (ec)
    return make_error(errc::invalid_argument, "worker '", to.worker, "' published address '",
                      to.host, "' that is not an IP address");
  if (auto local = dial_locally(to, addr)) return hs(std::move(*local), nullptr, d);
  auto tls = new_tls_session(true);
  if (!tls) return std::move(tls).error();
  asio::ip::tcp::socket sock(asio::make_strand(io_));
  asio::ip::tcp::endpoint ep(addr, to.port);
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
    return make_error(errc::timeout, "connecting to worker '", to.worker, "' at ", to.host, ":",
                      to.port, " timed out")
        .with_worker(to.worker);
  }
  if (auto e = fut.get())
    return make_error(errc::connection_lost, "cannot connect to worker '", to.worker, "' at ",
                      to.host, ":", to.port, ": ", e.message(), "; the worker may have died")
        .with_worker(to.worker);
  return hs(connection::socket_type(std::move(sock)), std::move(*tls), d);
}

expected<std::shared_ptr<connection>> transport::connect(const address& to, deadline d,
                                                         const handshake_fn& hs) {
  if (auto c = opened(to.worker)) return c;  // possibly failed: its sticky error then
  std::lock_guard<std::mutex> dial_lock(dial_mu_);
  if (auto c = opened(to.worker)) return c;
  auto c = dial(to, d, hs);
  if (!c) return std::move(c).error();
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_.load()) {
    (*c)->close(make_error(errc::shut_down, "the agent is shutting down"));
    return make_error(errc::shut_down, "worker '", opts_.worker, "' is shutting down");
  }
  opened_[to.worker] = *c;
  return *c;
}

std::shared_ptr<connection> transport::opened(const std::string& worker) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = opened_.find(worker);
  return it == opened_.end() ? nullptr : it->second;
}

void transport::keep_opened(const std::string& worker, std::shared_ptr<connection> c) {
  std::lock_guard<std::mutex> lk(mu_);
  opened_[worker] = std::move(c);
}

std::shared_ptr<connection> transport::take_opened(const std::string& worker) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = opened_.find(worker);
  if (it == opened_.end()) return nullptr;
  auto c = std::move(it->second);
  opened_.erase(it);
  return c;
}

void transport::forget(const std::shared_ptr<connection>& c, bool opened_too) {
  std::lock_guard<std::mutex> lk(mu_);
  accepted_.erase(c);
  if (!opened_too) return;
  if (auto it = opened_.find(c->peer().name); it != opened_.end() && it->second == c)
    opened_.erase(it);
}

std::vector<std::shared_ptr<connection>> transport::opened_all() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<connection>> v;
  v.reserve(opened_.size());
  for (auto& [n, c] : opened_) v.push_back(c);
  return v;
}

std::vector<std::shared_ptr<connection>> transport::all() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<connection>> v;
  v.reserve(opened_.size() + accepted_.size());
  for (auto& [n, c] : opened_) v.push_back(c);
  v.insert(v.end(), accepted_.begin(), accepted_.end());
  return v;
}

void transport::stop_accepting() {
  if (closing_.exchange(true)) return;
  if (!running_.load()) return;
  asio::post(io_, [this] {
    boost::system::error_code ec;
    if (acceptor_) acceptor_->close(ec);
    if (local_acceptor_) local_acceptor_->close(ec);
  });
}

void transport::stop() {
  work_.reset();
  io_.stop();
  for (auto& t : threads_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  threads_.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    opened_.clear();
    accepted_.clear();
  }
  accept_loop_.reset();
  local_accept_loop_.reset();
}

}  // namespace troupe::rpc::detail
