#include <utility>  // before Asio: g++ 12 needs it for Asio's coroutine support

#include <troupe/launcher/metrics_server.hpp>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <troupe/core/metrics.hpp>
#include <troupe/core/strcat.hpp>
#include <troupe/store/connect.hpp>

namespace troupe::launcher {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto io_timeout = std::chrono::seconds(5);
constexpr std::size_t max_connections = 32;
constexpr std::uint32_t max_header_bytes = 8 * 1024;
constexpr std::uint64_t max_body_bytes = 1024;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

metrics::sample own(std::string name, std::string help, metrics::kind k, double v) {
  metrics::sample s;
  s.name = std::move(name);
  s.help = std::move(help);
  s.kind = k;
  s.value = v;
  return s;
}

}  // namespace

std::string render_metrics(const job_status& st) {
  using metrics::kind;
  std::vector<metrics::sample> all{
      own("troupe_run_restarts_total", "restarts of this node's workers after failures",
          kind::counter, st.restarts),
      own("troupe_run_rendezvous_rounds_total", "rendezvous rounds this node took part in",
          kind::counter, static_cast<double>(st.rounds)),
      own("troupe_run_round", "the rendezvous round of the current attempt", kind::gauge,
          static_cast<double>(st.round)),
      own("troupe_run_workers_running", "this node's workers that are running", kind::gauge,
          st.running()),
      own("troupe_run_workers", "this node's workers in the current attempt", kind::gauge,
          static_cast<double>(st.workers.size())),
      own("troupe_run_membership_nodes", "nodes in the current round (replace mode: running now)",
          kind::gauge, st.nodes),
      own("troupe_run_world_size", "workers in the job's current round (replace mode: running now)",
          kind::gauge, st.world_size),
  };
  for (const auto& w : st.workers) {
    if (w.metrics_file.empty()) continue;
    auto text = read_file(w.metrics_file);
    if (text.empty()) continue;  // not written yet
    auto samples = metrics::decode_snapshot(text);
    if (!samples) continue;
    for (auto& s : *samples) {
      s.label_set.insert(s.label_set.begin(), {"rank", std::to_string(w.rank)});
      all.push_back(std::move(s));
    }
  }
  return metrics::prometheus_text(std::move(all));
}

struct metrics_server::impl {
  // Declared first, destroyed last: sessions destroyed with io_ still count down `open`.
  std::atomic<std::size_t> open{0};
  std::mutex mu;
  job_status status;
  std::string host;
  int port = 0;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;

  job_status current() {
    std::lock_guard lk(mu);
    return status;
  }
  void accept();
};

namespace {

// One connection: read one request within the limits, answer it, close.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket s, metrics_server::impl& srv) : stream_(std::move(s)), srv_(srv) {
    ++srv_.open;
  }
  ~session() { --srv_.open; }

  void start() {
    parser_.emplace();
    parser_->header_limit(max_header_bytes);
    parser_->body_limit(max_body_bytes);
    stream_.expires_after(io_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      return reply(http::status::payload_too_large, "text/plain",
                   "request too large (headers up to 8 KiB, body up to 1 KiB)\n", 11);
    }
    if (ec) return close();  // timed out, reset, or not HTTP
    const auto& req = parser_->get();
    const int version = req.version();
    if (req.method() != http::verb::get)
      return reply(http::status::method_not_allowed, "text/plain", "only GET is served\n", version);
    const auto raw_target = req.target();
    std::string_view target(raw_target.data(), raw_target.size());
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    if (target == "/metrics")
      return reply(http::status::ok, "text/plain; version=0.0.4; charset=utf-8",
                   render_metrics(srv_.current()), version);
    if (target == "/status")
      return reply(http::status::ok, "application/json", status_json(srv_.current()), version);
    reply(http::status::not_found, "text/plain",
          "not found; this troupe-run serves /metrics (Prometheus) and /status (JSON)\n", version);
  }

  void reply(http::status code, std::string_view type, std::string body, int version) {
    res_.result(code);
    res_.version(version);
    res_.set(http::field::server, "troupe-run");
    res_.set(http::field::content_type, std::string(type));
    res_.keep_alive(false);
    res_.body() = std::move(body);
    res_.prepare_payload();
    stream_.expires_after(io_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, std::size_t) {
      self->close();
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{max_header_bytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  metrics_server::impl& srv_;
};

}  // namespace

void metrics_server::impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      if (open.load() >= max_connections) {
        beast::error_code ignored;
        s.close(ignored);  // too many at once: the newcomer is turned away
      } else {
        std::make_shared<session>(std::move(s), *this)->start();
      }
    }
    accept();
  });
}

expected<std::unique_ptr<metrics_server>> metrics_server::start(const std::string& host, int port) {
  auto i = std::make_unique<impl>();
  beast::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec)
    return make_error(errc::invalid_argument, "--metrics-port: cannot listen on '", host,
                      "': it is not an IP address (", ec.message(), ")");
  const tcp::endpoint ep(addr, static_cast<std::uint16_t>(port));
  i->acceptor.open(ep.protocol(), ec);
  if (!ec) i->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) i->acceptor.bind(ep, ec);
  if (ec == asio::error::address_in_use)
    return make_error(errc::unavailable, "--metrics-port ", port, ": port ", port, " on ", host,
                      " is already in use by another program; choose a free port, or 0 to "
                      "let troupe-run pick one (it prints the port it chose)");
  if (!ec) i->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(errc::unavailable, "--metrics-port ", port, ": cannot listen on ", host, ":",
                      port, ": ", ec.message());
  i->host = host;
  i->port = i->acceptor.local_endpoint().port();
  i->accept();
  i->thread = std::thread([p = i.get()] {
    for (;;) {
      try {
        p->io.run();
        return;
      } catch (...) {
        // A handler threw (out of memory rendering a reply): keep serving the others.
      }
    }
  });
  return std::unique_ptr<metrics_server>(new metrics_server(std::move(i)));
}

metrics_server::metrics_server(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

metrics_server::~metrics_server() {
  asio::post(impl_->io, [p = impl_.get()] {
    beast::error_code ignored;
    p->acceptor.close(ignored);
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int metrics_server::port() const noexcept { return impl_->port; }

std::string metrics_server::url() const { return strcat("http://", impl_->host, ":", impl_->port); }

void metrics_server::publish(job_status status) {
  std::lock_guard lk(impl_->mu);
  impl_->status = std::move(status);
}

expected<std::string> fetch_status_table(const std::string& endpoint, duration timeout) {
  std::string_view e = endpoint;
  if (e.starts_with("http://")) e.remove_prefix(7);
  if (auto slash = e.find('/'); slash != std::string_view::npos) e = e.substr(0, slash);
  auto hp = parse_host_port(e);
  if (!hp)
    return make_error(errc::invalid_argument, "'", endpoint,
                      "' is not an endpoint; write "
                      "host:port or http://host:port, as troupe-run printed it for --metrics-port");
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, "/status", 11};
  req.set(http::field::host, hp->first);
  req.set(http::field::user_agent, "troupe-run status");
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024 * 1024);
  beast::error_code failure;
  std::string step = "resolve";
  bool done = false;
  stream.expires_after(timeout);
  resolver.async_resolve(
      hp->first, std::to_string(hp->second), [&](beast::error_code ec1, auto results) {
        if (ec1) return void(failure = ec1);
        step = "connect to";
        stream.async_connect(results, [&](beast::error_code ec2, const tcp::endpoint&) {
          if (ec2) return void(failure = ec2);
          step = "send the request to";
          http::async_write(stream, req, [&](beast::error_code ec3, std::size_t) {
            if (ec3) return void(failure = ec3);
            step = "read the answer of";
            http::async_read(stream, buffer, parser, [&](beast::error_code ec4, std::size_t) {
              if (ec4) return void(failure = ec4);
              done = true;
            });
          });
        });
      });
  io.run_for(timeout + std::chrono::milliseconds(100));
  const std::string where = strcat("http://", hp->first, ":", hp->second, "/status");
  if (!done) {
    std::string why = failure ? failure.message() : std::string("no answer");
    if (failure == beast::error::timeout || !failure)
      why = strcat("no answer within ", format_duration(timeout));
    return make_error(errc::unavailable, "cannot ", step, " ", where, ": ", why,
                      "; is troupe-run running there with --metrics-port ", hp->second, "?");
  }
  const auto& res = parser.get();
  if (res.result() != http::status::ok)
    return make_error(errc::protocol_error, where, " answered ", res.result_int(), ": ",
                      res.body());
  auto st = parse_status_json(res.body());
  if (!st)
    return make_error(errc::protocol_error, where,
                      " did not answer a troupe-run status: ", st.error().message());
  return status_table(*st);
}

}  // namespace troupe::launcher
