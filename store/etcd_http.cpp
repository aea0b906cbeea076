// The HTTP side of etcd_store: Beast over a per-connection io_context. Each call runs the
// connection's io_context on the calling thread until its operation completes; the
// deadline is the tcp_stream's expiry, and cancel_all() stops the io_contexts in use.
#include <utility>  // before Asio: g++ 12 needs it for Asio's coroutine support

#include "store/etcd_http.hpp"

#include <algorithm>
#include <array>
#include <charconv>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/log.hpp"

namespace troupe::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr std::size_t max_reply_bytes = std::size_t{256} << 20;

// A steady_timer cannot take time_point::max(); a year is "never" for a store call.
clock::time_point clamp(deadline until) {
  auto limit = clock::now() + std::chrono::hours(24 * 365);
  return std::min(until.time_point(), limit);
}

// Maps the gRPC status code etcd puts in an error reply onto our codes.
errc from_grpc_code(std::int64_t code) {
  switch (code) {
    case 1:
      return errc::aborted;  // CANCELLED
    case 3:
      return errc::invalid_argument;  // INVALID_ARGUMENT
    case 4:
      return errc::timeout;  // DEADLINE_EXCEEDED
    case 5:
      return errc::not_found;  // NOT_FOUND
    case 6:
      return errc::already_exists;  // ALREADY_EXISTS
    case 7:
      return errc::unauthorized;  // PERMISSION_DENIED
    case 9:
      return errc::invalid_argument;  // FAILED_PRECONDITION
    case 12:
      return errc::unsupported;  // UNIMPLEMENTED
    case 14:
      return errc::connection_lost;  // UNAVAILABLE (e.g. no leader)
    case 16:
      return errc::unauthorized;  // UNAUTHENTICATED
    default:
      return errc::unavailable;
  }
}

error reply_error(const etcd_endpoint& ep, std::string_view path, unsigned status,
                  const std::string& body) {
  auto parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    // Unary errors: {"error": "...", "message": "...", "code": 5}. Stream errors nest
    // the same fields under "error".
    const json& e =
        parsed.contains("error") && parsed["error"].is_object() ? parsed["error"] : parsed;
    std::string message = e.value("message", std::string{});
    if (message.empty() && e.contains("error") && e["error"].is_string())
      message = e["error"].get<std::string>();
    std::int64_t code = e.contains("code") ? json_int(e, "code") : json_int(e, "grpc_code");
    if (!message.empty())
      return make_error(from_grpc_code(code), "etcd at ", ep.text(), " refused POST ", path, ": ",
                        message, " (HTTP ", status, ", gRPC code ", code, ")");
  }
  std::string excerpt = body.substr(0, 200);
  while (!excerpt.empty() && (excerpt.back() == '\n' || excerpt.back() == '\r')) excerpt.pop_back();
  return make_error(status == 404 ? errc::unsupported : errc::protocol_error, "etcd at ", ep.text(),
                    " answered POST ", path, " with HTTP ", status, ": '", excerpt, "'",
                    status == 404 ? " (is this an etcd v3.4+ client URL?)" : "");
}

error io_error(const etcd_endpoint& ep, std::string_view what, std::string_view path,
               const boost::system::error_code& ec) {
  if (ec == beast::error::timeout)
    return make_error(errc::timeout, "etcd at ", ep.text(), " did not finish ", what, " of POST ",
                      path, " before the deadline");
  return make_error(errc::connection_lost, "the connection to etcd at ", ep.text(),
                    " broke during ", what, " of POST ", path, ": ", ec.message());
}

constexpr std::string_view base64_chars =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

// ---------------------------------------------------------------------------------------
// Small helpers.

std::string etcd_endpoint::text() const {
  if (host.find(':') != std::string::npos) return strcat('[', host, "]:", port);
  return strcat(host, ':', port);
}

expected<etcd_endpoint> parse_etcd_endpoint(std::string_view text) {
  std::string_view rest = text;
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  if (rest.starts_with("https://"))
    return make_error(errc::unsupported, "etcd endpoint '", text,
                      "': TLS is not supported; use a plain http client URL");
  while (rest.ends_with('/')) rest.remove_suffix(1);
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "bad etcd endpoint '", text, "': ", why,
                      " (expected host:port, e.g. 127.0.0.1:2379)");
  };
  std::string_view host, port;
  if (rest.starts_with('[')) {
    auto close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return bad("unterminated IPv6 address");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("empty host");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535)
    return bad("the port is not a number in 1..65535");
  return etcd_endpoint{std::string(host), static_cast<std::uint16_t>(value)};
}

std::string base64_encode(std::string_view data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(data[k]));
  };
  for (; i + 3 <= data.size(); i += 3) {
    std::uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    for (int s = 18; s >= 0; s -= 6) out += base64_chars[(v >> s) & 63];
  }
  if (std::size_t left = data.size() - i; left > 0) {
    std::uint32_t v = byte(i) << 16 | (left == 2 ? byte(i + 1) << 8 : 0);
    out += base64_chars[(v >> 18) & 63];
    out += base64_chars[(v >> 12) & 63];
    out += left == 2 ? base64_chars[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

expected<std::string> base64_decode(std::string_view text) {
  std::array<int, 256> index{};
  index.fill(-1);
  for (std::size_t k = 0; k < base64_chars.size(); ++k)
    index[static_cast<unsigned char>(base64_chars[k])] = static_cast<int>(k);
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t acc = 0;
  int bits = 0;
  std::size_t pad = 0;
  for (char ch : text) {
    if (ch == '=') {
      ++pad;
      continue;
    }
    int v = index[static_cast<unsigned char>(ch)];
    if (v < 0 || pad > 0)
      return make_error(errc::protocol_error, "etcd sent malformed base64 '", text.substr(0, 64),
                        "'");
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::int64_t json_int(const json& object, std::string_view field) {
  if (!object.is_object()) return 0;
  auto it = object.find(field);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::int64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Connections.

class etcd_connection {
 public:
  explicit etcd_connection(std::size_t endpoint_index) : endpoint(endpoint_index) {}
  ~etcd_connection() {
    boost::system::error_code ignored;
    stream.socket().close(ignored);
  }

  // Runs the io_context until the operation started on it completes. False when
  // cancel_all() interrupted it (the connection must then be dropped).
  bool run() {
    ioc.restart();
    if (cancelled.load()) return false;
    ioc.run();
    return !cancelled.load();
  }

  // Whether an idle pooled connection still looks usable: no EOF, reset or stray bytes.
  bool looks_alive() {
    if (buffer.size() != 0) return false;
    auto& sock = stream.socket();
    boost::system::error_code ec;
    sock.non_blocking(true, ec);
    if (ec) return false;
    char probe = 0;
    sock.receive(asio::buffer(&probe, 1), tcp::socket::message_peek, ec);
    boost::system::error_code ignored;
    sock.non_blocking(false, ignored);
    return ec == asio::error::would_block;
  }

  asio::io_context ioc{1};
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  std::size_t endpoint;
  bool reused = false;
  std::atomic<bool> cancelled{false};
};

etcd_http::etcd_http(std::vector<etcd_endpoint> endpoints) : endpoints_(std::move(endpoints)) {}

etcd_http::~etcd_http() = default;

std::string etcd_http::describe() const {
  std::string out;
  for (const auto& ep : endpoints_) out += (out.empty() ? "" : ",") + ep.text();
  return out;
}

bool etcd_http::enter(etcd_connection& c, bool ignore_cancel) {
  std::lock_guard lock(mu_);
  if (cancelled_ && !ignore_cancel) return false;
  active_.insert(&c);
  return true;
}

void etcd_http::leave(etcd_connection& c) {
  std::lock_guard lock(mu_);
  active_.erase(&c);
}

void etcd_http::cancel_all() {
  std::vector<std::unique_ptr<etcd_connection>> dropped;
  std::lock_guard lock(mu_);
  cancelled_ = true;
  for (auto* c : active_) {
    c->cancelled.store(true);
    c->ioc.stop();
  }
  dropped.swap(idle_);
}

void etcd_http::release(std::unique_ptr<etcd_connection> c) {
  leave(*c);
  if (c->cancelled.load()) return;
  c->reused = true;
  std::lock_guard lock(mu_);
  if (!cancelled_ && idle_.size() < 16) idle_.push_back(std::move(c));
}

namespace {

error cancelled_error(std::string_view path) {
  return make_error(errc::shut_down, "the etcd client was closed while POST ", path,
                    " was in flight");
}

// Removes a connection from the active set when the call using it ends (unless it was
// handed on to the pool or to a stream).
struct active_guard {
  etcd_http* http;
  std::unique_ptr<etcd_connection>* conn;
  void (*leave)(etcd_http*, etcd_connection&);
  ~active_guard() {
    if (*conn) leave(http, **conn);
  }
};

}  // namespace

expected<std::unique_ptr<etcd_connection>> etcd_http::acquire(deadline until, bool ignore_cancel,
                                                              bool fresh) {
  if (!fresh) {
    for (;;) {
      std::unique_ptr<etcd_connection> c;
      {
        std::lock_guard lock(mu_);
        if (cancelled_ && !ignore_cancel)
          return make_error(errc::shut_down, "the etcd client is closed");
        if (idle_.empty()) break;
        c = std::move(idle_.back());
        idle_.pop_back();
      }
      if (c->looks_alive()) {
        if (!enter(*c, ignore_cancel))
          return make_error(errc::shut_down, "the etcd client is closed");
        return c;
      }
    }
  }
  std::string failures;
  const std::size_t n = endpoints_.size();
  const std::size_t first = preferred_.load();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t index = (first + i) % n;
    const etcd_endpoint& ep = endpoints_[index];
    auto c = std::make_unique<etcd_connection>(index);
    if (!enter(*c, ignore_cancel)) return make_error(errc::shut_down, "the etcd client is closed");

    boost::system::error_code ec;
    tcp::resolver::results_type addresses;
    boost::system::error_code addr_ec;
    auto address = asio::ip::make_address(ep.host, addr_ec);
    if (!addr_ec) {
      addresses = tcp::resolver::results_type::create(tcp::endpoint(address, ep.port), ep.host,
                                                      std::to_string(ep.port));
    } else {
      // A host name: resolve asynchronously so that the deadline bounds it too.
      tcp::resolver resolver(c->ioc);
      asio::steady_timer timer(c->ioc, clamp(until));
      timer.async_wait([&](const boost::system::error_code& e) {
        if (!e) resolver.cancel();
      });
      resolver.async_resolve(
          ep.host, std::to_string(ep.port),
          [&](const boost::system::error_code& e, tcp::resolver::results_type r) {
            ec = e;
            addresses = std::move(r);
            timer.cancel();
          });
      bool finished = c->run();
      if (!finished) {
        leave(*c);
        return make_error(errc::shut_down, "the etcd client was closed while resolving ",
                          ep.text());
      }
      if (ec == asio::error::operation_aborted) ec = beast::error::timeout;
    }
    if (!ec) {
      c->stream.expires_at(clamp(until));
      c->stream.async_connect(
          addresses, [&](const boost::system::error_code& e, const tcp::endpoint&) { ec = e; });
      if (!c->run()) {
        leave(*c);
        return make_error(errc::shut_down, "the etcd client was closed while connecting to ",
                          ep.text());
      }
    }
    if (!ec) {
      preferred_.store(index);
      return c;
    }
    leave(*c);
    if (ec == beast::error::timeout || until.expired())
      return make_error(errc::timeout, "could not connect to etcd at ", ep.text(),
                        " before the deadline", failures.empty() ? "" : " (", failures,
                        failures.empty() ? "" : ")");
    failures += strcat(failures.empty() ? "" : "; ", ep.text(), ": ", ec.message());
    TROUPE_LOG(log_level::debug, "store", "etcd endpoint ", ep.text(), " failed (", ec.message(),
               "), trying the next");
  }
  return make_error(errc::connection_lost, "could not connect to etcd (", failures,
                    "); is etcd running and is this its client URL?");
}

expected<json> etcd_http::post(std::string_view path, const json& body, deadline until,
                               etcd_call options) {
  const std::string text = body.dump();
  for (int attempt = 0;; ++attempt) {
    auto acquired = acquire(until, options.ignore_cancel, /*fresh=*/attempt > 0);
    if (!acquired) return std::move(acquired).error();
    std::unique_ptr<etcd_connection> c = std::move(*acquired);
    active_guard guard{this, &c, [](etcd_http* h, etcd_connection& x) { h->leave(x); }};
    const etcd_endpoint& ep = endpoints_[c->endpoint];

    http::request<http::string_body> req{http::verb::post, std::string(path), 11};
    req.set(http::field::host, ep.text());
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = text;
    req.prepare_payload();

    boost::system::error_code ec;
    c->stream.expires_at(clamp(until));
    http::async_write(c->stream, req,
                      [&](const boost::system::error_code& e, std::size_t) { ec = e; });
    if (!c->run()) return cancelled_error(path);
    const bool may_retry = c->reused && options.retry_safe && attempt == 0;
    if (ec) {
      if (may_retry && ec != beast::error::timeout) continue;
      return io_error(ep, "sending", path, ec);
    }

    http::response_parser<http::string_body> parser;
    parser.body_limit(max_reply_bytes);
    http::async_read(c->stream, c->buffer, parser,
                     [&](const boost::system::error_code& e, std::size_t) { ec = e; });
    if (!c->run()) return cancelled_error(path);
    if (ec) {
      if (may_retry && !parser.got_some() && ec != beast::error::timeout) continue;
      return io_error(ep, "reading the reply", path, ec);
    }
    auto& res = parser.get();
    const unsigned status = res.result_int();
    std::string reply = std::move(res.body());
    if (res.keep_alive()) {
      release(std::move(c));
    }
    if (status != 200) return reply_error(ep, path, status, reply);
    auto parsed = json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded())
      return make_error(errc::protocol_error, "etcd at ", ep.text(), " answered POST ", path,
                        " with text that is not JSON: '", reply.substr(0, 200), "'");
    return parsed;
  }
}

// ---------------------------------------------------------------------------------------
// Streams.

struct etcd_stream::state {
  etcd_http* http = nullptr;
  std::unique_ptr<etcd_connection> conn;
  http::response_parser<http::string_body> parser;
  std::string path;
  std::string pending;
};

etcd_stream::etcd_stream(std::unique_ptr<state> s) : state_(std::move(s)) {}

etcd_stream::~etcd_stream() {
  if (state_ && state_->conn) state_->http->leave(*state_->conn);
}

expected<json> etcd_stream::next(deadline until) {
  state& s = *state_;
  const etcd_endpoint& ep = s.http->endpoints_[s.conn->endpoint];
  for (;;) {
    if (auto nl = s.pending.find('\n'); nl != std::string::npos) {
      std::string line = s.pending.substr(0, nl);
      s.pending.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      auto parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded())
        return make_error(errc::protocol_error, "etcd at ", ep.text(), " sent a line on ", s.path,
                          " that is not JSON: '", line.substr(0, 200), "'");
      return parsed;
    }
    if (s.parser.is_done())
      return make_error(errc::connection_lost, "etcd at ", ep.text(), " closed the stream ",
                        s.path);
    if (until.expired())
      return make_error(errc::timeout, "no message from etcd at ", ep.text(), " on ", s.path,
                        " before the deadline");
    boost::system::error_code ec;
    s.conn->stream.expires_at(clamp(until));
    http::async_read_some(s.conn->stream, s.conn->buffer, s.parser,
                          [&](const boost::system::error_code& e, std::size_t) { ec = e; });
    if (!s.conn->run()) return cancelled_error(s.path);
    auto& body = s.parser.get().body();
    s.pending += body;
    body.clear();
    if (ec == http::error::end_of_stream || ec == asio::error::eof)
      return make_error(errc::connection_lost, "etcd at ", ep.text(), " closed the stream ",
                        s.path);
    if (ec) return io_error(ep, "reading the stream", s.path, ec);
  }
}

expected<std::unique_ptr<etcd_stream>> etcd_http::open_stream(std::string_view path,
                                                              const json& body, deadline until) {
  auto acquired = acquire(until, /*ignore_cancel=*/false, /*fresh=*/true);
  if (!acquired) return std::move(acquired).error();
  auto s = std::make_unique<etcd_stream::state>();
  s->http = this;
  s->path = std::string(path);
  s->conn = std::move(*acquired);
  s->parser.body_limit(boost::none);
  // From here on the stream owns the registration; its destructor leaves.
  std::unique_ptr<etcd_stream> stream(new etcd_stream(std::move(s)));
  auto& st = *stream->state_;
  etcd_connection& c = *st.conn;
  const etcd_endpoint& ep = endpoints_[c.endpoint];

  http::request<http::string_body> req{http::verb::post, std::string(path), 11};
  req.set(http::field::host, ep.text());
  req.set(http::field::content_type, "application/json");
  req.body() = body.dump();
  req.prepare_payload();

  boost::system::error_code ec;
  c.stream.expires_at(clamp(until));
  http::async_write(c.stream, req,
                    [&](const boost::system::error_code& e, std::size_t) { ec = e; });
  if (!c.run()) return cancelled_error(path);
  if (ec) return io_error(ep, "sending", path, ec);
  http::async_read_header(c.stream, c.buffer, st.parser,
                          [&](const boost::system::error_code& e, std::size_t) { ec = e; });
  if (!c.run()) return cancelled_error(path);
  if (ec) return io_error(ep, "reading the reply header", path, ec);
  const unsigned status = st.parser.get().result_int();
  if (status != 200) {
    http::async_read(c.stream, c.buffer, st.parser,
                     [&](const boost::system::error_code& e, std::size_t) { ec = e; });
    if (!c.run()) return cancelled_error(path);
    return reply_error(ep, path, status, st.parser.get().body());
  }
  return stream;
}

}  // namespace troupe::detail
