// The TCP store server: a few event loops (an io_context and its one thread each), the
// connections spread over them, and one shared table guarded by a mutex that is never held
// while touching a socket (store/detail/server_core.hpp, server_connection.hpp).
#include <utility>  // before Asio, for g++ 12

#include <troupe/store/tcp_store_server.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include <troupe/core/log.hpp>
#include <troupe/core/net_address.hpp>
#include <troupe/net/accept_backoff.hpp>
#include <troupe/net/local_listener.hpp>
#include <troupe/store/detail/server_connection.hpp>
#include <troupe/store/detail/server_core.hpp>

namespace troupe {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using detail::server_connection;
using detail::server_core;

namespace {

// An io_context run by exactly one thread: the connections on it need no strand.
struct event_loop {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  std::promise<void> exited;
  std::atomic<std::size_t> connections{0};

  void run(const std::string& name) {
    for (;;) {
      try {
        io.run();
        break;
      } catch (const std::exception& e) {
        TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught: ", e.what());
      } catch (...) {
        TROUPE_LOG(log_level::error, "store", name, ": I/O thread caught an exception");
      }
    }
    exited.set_value();
  }
};

}  // namespace

struct tcp_store_server::impl {
  std::vector<std::unique_ptr<event_loop>> loops;  // declared before what lives on them
  std::optional<tcp::acceptor> acceptor;           // on loops[0]
  std::optional<asio::local::stream_protocol::acceptor> local_acceptor;  // on loops[0]
  std::shared_ptr<server_core> core = std::make_shared<server_core>();
  std::string host;
  std::uint16_t port = 0;
  std::size_t next_loop = 0;  // only on loops[0]: round-robin placement of connections
  // Only on loops[0]: the pause after failed accepts (EMFILE and the like), one per
  // listener so that both can wait at once.
  std::optional<net::accept_backoff> accept_pause;
  std::optional<net::accept_backoff> local_accept_pause;
  std::size_t refused_connections = 0;
  std::chrono::steady_clock::time_point last_refusal_log{};
  std::mutex shutdown_mu;
  bool stopped = false;

  // Accepts on loops[0]; each new connection goes to the next loop in turn.
  void accept() { accept_on(*acceptor, *accept_pause); }
  void accept_local() { accept_on(*local_acceptor, *local_accept_pause); }

  template <class Acceptor>
  void accept_on(Acceptor& from, net::accept_backoff& pause) {
    auto& loop = *loops[next_loop];
    next_loop = (next_loop + 1) % loops.size();
    from.async_accept(
        loop.io, [this, &loop, &from, &pause](boost::system::error_code ec,
                                              typename Acceptor::protocol_type::socket s) {
          if (ec == asio::error::operation_aborted || !from.is_open()) return;
          if (ec) {
            // Out of descriptors or memory: wait before the next accept, so that a full fd
            // table costs neither a core nor the log; open connections are served meanwhile.
            (void)pause.retry_after_failure(ec, [this, &from, &pause] {
              if (from.is_open()) accept_on(from, pause);
            });
            return;
          }
          pause.succeeded();
          {
            std::string peer = describe_peer(s);
            // TCP connections speak TLS when the server has an identity; the local socket
            // stays plain (it reaches only processes of this host).
            std::unique_ptr<tls::session> session;
            if (core->tls && std::is_same_v<Acceptor, tcp::acceptor>) {
              auto made = tls::session::make(core->tls, false);
              if (!made) {
                TROUPE_LOG(log_level::warn, "store", core->name, ": closing the connection from ",
                           peer, ": ", made.error().message());
                boost::system::error_code ignored;
                s.close(ignored);
                accept_on(from, pause);
                return;
              }
              session = std::move(*made);
            }
            auto c = std::make_shared<server_connection>(
                loop.io, server_connection::stream_socket(std::move(s)), std::move(peer), core,
                std::move(session));
            bool full = false;
            {
              std::lock_guard lk(core->mu);
              full = core->connections.size() >= core->options.max_connections;
              if (!full) core->connections.emplace(c.get(), c);
            }
            if (full) {
              refused_full(c);
            } else {
              c->start();
            }
          }
          accept_on(from, pause);
        });
  }

  // A connection past max_connections: closed at once, logged at most once a second.
  void refused_full(const std::shared_ptr<server_connection>& c) {
    ++refused_connections;
    auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log >= std::chrono::seconds(1)) {
      TROUPE_LOG(log_level::warn, "store", core->name, ": ", refused_connections,
                 " connection(s) refused since the last report (the latest from ", c->peer(),
                 "): ", core->options.max_connections,
                 " are open, the limit (raise max_connections if intended)");
      refused_connections = 0;
      last_refusal_log = now;
    }
    c->drop();
  }

  static std::string describe_peer(tcp::socket& s) {
    boost::system::error_code ec;
    auto ep = s.remote_endpoint(ec);
    return ec ? std::string("an unknown peer") : strcat(ep.address().to_string(), ":", ep.port());
  }

  static std::string describe_peer(asio::local::stream_protocol::socket& s) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
      return strcat("local process ", cred.pid);
    return "a local peer";
  }

  // Listens on the local socket when bound to a loopback address; a name already taken
  // (by a server in another process bound to the same address and port, which cannot
  // happen within one network namespace) or any other failure only loses the fast path.
  void listen_locally(const asio::ip::address& bound) {
    if (!core->options.local_socket) return;
    local_acceptor = net::listen_beside(loops[0]->io, "store", bound, port, "store", core->name);
    if (local_acceptor) accept_local();
  }
};

tcp_store_server::tcp_store_server(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

expected<std::unique_ptr<tcp_store_server>> tcp_store_server::start(
    tcp_store_server_options options) {
  if (options.host.empty())
    return make_error(errc::invalid_argument,
                      "tcp store server: the host to bind is empty; give an address such as "
                      "127.0.0.1 (or 0.0.0.0 to listen on every interface)");
  if (options.max_frame_size < 64)
    return make_error(errc::invalid_argument, "tcp store server: max_frame_size ",
                      options.max_frame_size, " is too small; use at least 64 bytes");
  if (options.max_unread_output == 0)
    options.max_unread_output = options.max_queued_output + 2 * options.max_frame_size;
  if (options.max_unread_output < options.max_queued_output)
    return make_error(errc::invalid_argument, "tcp store server: max_unread_output ",
                      options.max_unread_output, " is below max_queued_output ",
                      options.max_queued_output,
                      "; raise it, or give 0 for the default (max_queued_output + 2 * "
                      "max_frame_size)");
  if (options.io_threads > 64)
    return make_error(
        errc::invalid_argument, "tcp store server: io_threads ", options.io_threads,
        " is more than 64; use 0 for the default (one per hardware thread, at most 4)");
  std::shared_ptr<const tls::context> tls_context;
  if (options.tls.enabled()) {
    auto made = tls::context::make(options.tls);
    if (!made) return make_error(made.error().code(), "tcp store server: ", made.error().message());
    tls_context = std::move(*made);
  }
  std::size_t threads = options.io_threads;
  // One loop per hardware thread, at most 4: on a 2-core machine shared with 8-32 client
  // processes, 2 loops served 5-10% more requests than 1 (bench/RESULTS.md).
  if (threads == 0) threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
  auto i = std::make_unique<impl>();
  for (std::size_t n = 0; n < threads; ++n) i->loops.push_back(std::make_unique<event_loop>());
  i->acceptor.emplace(i->loops[0]->io);
  boost::system::error_code ec;
  tcp::endpoint ep;
  auto addr = asio::ip::make_address(options.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, options.port);
  } else {
    tcp::resolver resolver(i->loops[0]->io);
    auto results =
        resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::passive, ec);
    if (ec || results.empty())
      return make_error(errc::invalid_argument, "tcp store server: cannot resolve host '",
                        options.host, "': ", ec ? ec.message() : "no addresses");
    ep = results.begin()->endpoint();
  }
  auto fail = [&](std::string_view step) {
    return make_error(errc::unavailable, "tcp store server: cannot ", step, " ",
                      ep.address().to_string(), ":", options.port, ": ", ec.message(),
                      options.port != 0 ? "; pick another port or use port 0 for a free one" : "");
  };
  i->acceptor->open(ep.protocol(), ec);
  if (ec) return fail("open a socket for");
  i->acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  i->acceptor->bind(ep, ec);
  if (ec) return fail("bind");
  i->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen on");
  auto local = i->acceptor->local_endpoint(ec);
  if (ec) return fail("read the bound address of");
  i->host = local.address().to_string();
  i->port = local.port();
  i->core->options = std::move(options);
  i->core->tls = std::move(tls_context);
  i->core->name = strcat("tcp store server ", i->host, ":", i->port);
  i->accept_pause.emplace(i->loops[0]->io, "store", i->core->name);
  i->local_accept_pause.emplace(i->loops[0]->io, "store", i->core->name + " (local socket)");
  i->accept();
  i->listen_locally(local.address());
  for (auto& l : i->loops) {
    auto* loop = l.get();
    loop->thread = std::thread([loop, name = i->core->name] { loop->run(name); });
  }
  TROUPE_LOG(log_level::info, "store", i->core->name, ": listening on ", i->loops.size(),
             i->loops.size() == 1 ? " I/O thread" : " I/O threads",
             i->core->tls ? " (TCP connections with mutual TLS)" : "");
  return std::unique_ptr<tcp_store_server>(new tcp_store_server(std::move(i)));
}

tcp_store_server::~tcp_store_server() { shutdown(impl_->core->options.shutdown_timeout); }

const std::string& tcp_store_server::host() const noexcept { return impl_->host; }
std::uint16_t tcp_store_server::port() const noexcept { return impl_->port; }
std::string tcp_store_server::url() const {
  bool v6 = impl_->host.find(':') != std::string::npos;
  return strcat("tcp://", v6 ? "[" : "", impl_->host, v6 ? "]" : "", ":", impl_->port);
}

bool tcp_store_server::has_local_socket() const noexcept {
  return impl_->local_acceptor.has_value();
}

bool tcp_store_server::uses_tls() const noexcept { return impl_->core->tls != nullptr; }

std::string local_socket_name(std::string_view address, std::uint16_t port) {
  return local_socket_name("store", address, port);
}

std::size_t tcp_store_server::num_connections() const {
  std::lock_guard lk(impl_->core->mu);
  return impl_->core->connections.size();
}

std::size_t tcp_store_server::queued_output_bytes() const {
  return impl_->core->queued_output.load(std::memory_order_relaxed);
}

void tcp_store_server::shutdown(duration timeout) {
  auto& i = *impl_;
  std::lock_guard lk(i.shutdown_mu);
  if (i.stopped) return;
  i.stopped = true;
  auto until = deadline::after(timeout);
  // Runs on loops[0], after any accept already in flight: nothing new registers. Each loop
  // then ends once its connections have closed.
  asio::post(i.loops[0]->io, [&i] {
    boost::system::error_code ec;
    i.acceptor->close(ec);
    if (i.local_acceptor) i.local_acceptor->close(ec);
    if (i.accept_pause) i.accept_pause->cancel();
    if (i.local_accept_pause) i.local_accept_pause->cancel();
    std::vector<std::shared_ptr<server_connection>> open;
    {
      std::lock_guard clk(i.core->mu);
      for (auto& [p, weak] : i.core->connections)
        if (auto c = weak.lock()) open.push_back(std::move(c));
    }
    for (auto& c : open)
      asio::post(c->loop(), [c] { c->close("the server is shutting down", false); });
    for (auto& l : i.loops) asio::post(l->io, [loop = l.get()] { loop->work.reset(); });
  });
  bool in_time = true;
  for (auto& l : i.loops) {
    auto done = l->exited.get_future();
    if (in_time && done.wait_until(until.time_point()) != std::future_status::ready)
      in_time = false;
  }
  if (!in_time) {
    TROUPE_LOG(log_level::warn, "store", i.core->name, ": connections did not close within ",
               format_duration(timeout), "; stopping the I/O threads anyway");
    for (auto& l : i.loops) l->io.stop();
  }
  for (auto& l : i.loops) l->thread.join();
  TROUPE_LOG(log_level::info, "store", i.core->name, ": shut down");
}

}  // namespace troupe
