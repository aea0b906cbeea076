// Why this file is long (~830 lines): unary calls, watch streams, the TLS handshake and the
// user's sign-in all act on one private connection type (its io_context, stream, buffer and
// cancellation), and their failures share one vocabulary of hints. Splitting them would put
// that type in a header every part includes; the TLS context set-up is the first piece to
// move out when this grows.
//
// The HTTP side of etcd_store: Beast over a per-connection io_context. Each call runs the
// connection's io_context on the calling thread until its operation completes; the
// deadline is the tcp_stream's expiry, and cancel_all() stops the io_contexts in use.
#include <utility>  // before Asio: g++ 12 needs it for Asio's coroutine support

#include <troupe/store/etcd_http.hpp>

#include <algorithm>
#include <array>
#include <charconv>

#include <fstream>
#include <sstream>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <troupe/core/log.hpp>

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
    if (!message.empty()) {
      // What to do about the refusals a misconfigured client meets first.
      std::string_view hint;
      errc kind = from_grpc_code(code);
      if (message.find("user name is empty") != std::string::npos) {
        hint =
            "; etcd has authentication on: give a user and its password (--rdzv-conf "
            "user=NAME,password_file=PATH, or ?user=NAME&password_file=PATH in the store URL)";
        kind = errc::unauthorized;
      } else if (message.find("permission denied") != std::string::npos) {
        hint = "; the etcd user lacks a role that may read and write the job's prefix";
        kind = errc::unauthorized;
      }
      return make_error(kind, "etcd at ", ep.text(), " refused POST ", path, ": ", message,
                        " (HTTP ", status, ", gRPC code ", code, ")", hint);
    }
  }
  if (body.find("HTTPS server") != std::string::npos)
    return make_error(errc::protocol_error, "etcd at ", ep.text(),
                      " serves https, and this client spoke plain http: write https://", ep.text(),
                      " (or --rdzv-conf protocol=https, or ?protocol=https in the store "
                      "URL) and give the CA that signed etcd's certificate (cacert)");
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
  bool https = false;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
    https = true;
  }
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
  return etcd_endpoint{std::string(host), static_cast<std::uint16_t>(value), https};
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

using tls_stream = asio::ssl::stream<beast::tcp_stream&>;

// The completion handler of every HTTP read and write: it keeps the result's code. One
// type for all of them, so that Beast's operations are compiled once per stream type and
// message type, not once per call site (this file was the costliest of the build).
struct set_code {
  boost::system::error_code* ec;
  void operator()(const boost::system::error_code& e, std::size_t) const { *ec = e; }
};

class etcd_connection {
 public:
  explicit etcd_connection(std::size_t endpoint_index) : endpoint(endpoint_index) {}
  ~etcd_connection() {
    tls.reset();  // no close_notify: the socket closes under it
    boost::system::error_code ignored;
    stream.socket().close(ignored);
  }

  // Calls f with the stream that carries HTTP: the TLS stream over https, else the socket.
  // Deadlines are the tcp_stream's either way.
  template <class F>
  void io(F&& f) {
    if (tls)
      f(*tls);
    else
      f(stream);
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
  std::unique_ptr<tls_stream> tls;  // over https, set up by the handshake
  beast::flat_buffer buffer;
  std::size_t endpoint;
  bool reused = false;
  std::atomic<bool> cancelled{false};
};

struct etcd_http::tls_context {
  asio::ssl::context ctx{asio::ssl::context::tls_client};
};

etcd_http::etcd_http(std::vector<etcd_endpoint> endpoints) : endpoints_(std::move(endpoints)) {
  for (const auto& ep : endpoints_) security_.tls = security_.tls || ep.https;
}

etcd_http::~etcd_http() = default;

std::string etcd_http::describe() const {
  std::string out;
  for (const auto& ep : endpoints_)
    out += (out.empty() ? "" : ",") + std::string(security_.tls ? "https://" : "") + ep.text();
  return out;
}

namespace {

// OpenSSL's reason for the last failure, e.g. "no such file" or "key values mismatch".
std::string openssl_reason(const boost::system::error_code& ec) {
  std::string reason = ec.message();
  if (auto e = ERR_peek_last_error(); e != 0) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    reason = text;
  }
  ERR_clear_error();
  return reason;
}

bool readable(const std::string& path) { return std::ifstream(path).good(); }

// What a failed TLS handshake most likely means, for the error's last clause.
std::string_view handshake_hint(const std::string& reason, const etcd_http_security& s) {
  if (reason.find("wrong version number") != std::string::npos ||
      reason.find("packet length too long") != std::string::npos ||
      reason.find("stream truncated") != std::string::npos ||
      reason.find("End of file") != std::string::npos ||
      reason.find("Connection reset") != std::string::npos)
    return "etcd does not speak TLS on this port: write http://host:port (protocol=http), or "
           "check that this is etcd's https client URL";
  if (reason.find("certificate verify failed") != std::string::npos)
    return s.ca_file.empty()
               ? "etcd's certificate is not signed by a CA this system trusts: give the CA "
                 "(--rdzv-conf cacert=PATH or ?cacert=PATH)"
               : "etcd's certificate is not signed by that CA, or does not name this endpoint's "
                 "host: check cacert, and that the certificate lists the address you connect to";
  if (reason.find("certificate required") != std::string::npos ||
      reason.find("bad certificate") != std::string::npos ||
      reason.find("unknown ca") != std::string::npos ||
      reason.find("handshake failure") != std::string::npos)
    return s.cert_file.empty()
               ? "etcd asks for a client certificate (--client-cert-auth): give cert=PATH and "
                 "key=PATH"
               : "etcd refused this client's certificate: is it signed by the CA etcd trusts "
                 "(its --trusted-ca-file)?";
  return "check the endpoint's protocol and the TLS files";
}

// A TLS failure after the handshake: under TLS 1.3 a server that refuses the client's
// certificate says so with an alert on the first read.
bool is_tls_error(const boost::system::error_code& ec) {
  return ec.category() == asio::error::get_ssl_category();
}

error tls_error(const etcd_endpoint& ep, std::string_view what, std::string_view path,
                const boost::system::error_code& ec, const etcd_http_security& security) {
  std::string reason = openssl_reason(ec);
  return make_error(errc::unauthorized, "etcd at ", ep.text(), " ended the TLS session during ",
                    what, " of POST ", path, ": ", reason, "; ", handshake_hint(reason, security));
}

// TLS 1.3 completes the client's side of the handshake before the server has checked the
// client's certificate (or its absence): a server that refuses it sends an alert and
// closes, and the first request on the new connection fails with that alert when it is
// read first, or with a reset or an end of file when the close wins (the alert is then
// lost with the connection). The latter is taken for the same refusal.
bool closed_after_handshake(const etcd_connection& c, const boost::system::error_code& ec) {
  return c.tls && !c.reused &&
         (ec == asio::error::connection_reset || ec == asio::error::eof ||
          ec == asio::error::broken_pipe || ec == http::error::end_of_stream);
}

error refused_after_handshake(const etcd_endpoint& ep, std::string_view what, std::string_view path,
                              const boost::system::error_code& ec,
                              const etcd_http_security& security) {
  return make_error(errc::unauthorized, "etcd at ", ep.text(),
                    " closed a new TLS session at its first request, during ", what, " of POST ",
                    path, " (", ec.message(), "), which is how it refuses a client under TLS 1.3; ",
                    handshake_hint("certificate required", security));
}

// A plain-http connection that etcd closes without a word: most likely an https port.
std::string_view plain_close_hint(const boost::system::error_code& ec, bool tls) {
  if (tls || (ec != http::error::end_of_stream && ec != asio::error::eof &&
              ec != asio::error::connection_reset))
    return "";
  return "; if this etcd serves https, write https://host:port (or protocol=https) and give the "
         "CA that signed its certificate (cacert)";
}

}  // namespace

expected<void> etcd_http::secure(etcd_http_security security) {
  const bool any_https = std::any_of(endpoints_.begin(), endpoints_.end(),
                                     [](const etcd_endpoint& ep) { return ep.https; });
  const bool all_https = std::all_of(endpoints_.begin(), endpoints_.end(),
                                     [](const etcd_endpoint& ep) { return ep.https; });
  if (any_https && !all_https)
    return make_error(errc::invalid_argument, "etcd endpoints ", describe(),
                      " mix http:// and https://; an etcd cluster serves one or the other");
  security.tls = security.tls || any_https;
  if (!security.tls &&
      (!security.ca_file.empty() || !security.cert_file.empty() || !security.key_file.empty()))
    return make_error(errc::invalid_argument,
                      "etcd TLS files (cacert, cert, key) are given, but the endpoints are plain "
                      "http: write https://host:port or protocol=https");
  if (security.cert_file.empty() != security.key_file.empty())
    return make_error(errc::invalid_argument, "an etcd client certificate needs both cert (",
                      security.cert_file.empty() ? "missing" : security.cert_file, ") and key (",
                      security.key_file.empty() ? "missing" : security.key_file, ")");
  if (!security.user.empty() && security.password.empty())
    return make_error(errc::invalid_argument, "etcd user '", security.user,
                      "' has no password: give password_file=PATH (a file holding it)");
  if (security.tls) {
    auto t = std::make_unique<tls_context>();
    boost::system::error_code ec;
    auto load = [&](std::string_view what, const std::string& path, auto fn) -> expected<void> {
      if (!readable(path))
        return make_error(errc::invalid_argument, "cannot read the etcd ", what, " file '", path,
                          "'");
      fn(ec);
      if (!ec) return ok();
      std::string reason = openssl_reason(ec);
      if (reason.find("key values mismatch") != std::string::npos)
        return make_error(errc::invalid_argument, "the etcd client key '", path,
                          "' does not belong to the certificate '", security.cert_file, "'");
      return make_error(errc::invalid_argument, "the etcd ", what, " file '", path,
                        "' is not usable: ", reason);
    };
    t->ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
    t->ctx.set_verify_mode(asio::ssl::verify_peer);
    if (security.ca_file.empty()) {
      t->ctx.set_default_verify_paths(ec);
    } else if (auto r = load("CA (cacert)", security.ca_file,
                             [&](auto& e) { t->ctx.load_verify_file(security.ca_file, e); });
               !r) {
      return r;
    }
    if (!security.cert_file.empty()) {
      if (auto r = load("client certificate (cert)", security.cert_file,
                        [&](auto& e) { t->ctx.use_certificate_chain_file(security.cert_file, e); });
          !r)
        return r;
      if (auto r = load("client key (key)", security.key_file,
                        [&](auto& e) {
                          t->ctx.use_private_key_file(security.key_file, asio::ssl::context::pem,
                                                      e);
                        });
          !r)
        return r;
      if (SSL_CTX_check_private_key(t->ctx.native_handle()) != 1) {
        boost::system::error_code none;
        return make_error(errc::invalid_argument, "the etcd client key '", security.key_file,
                          "' does not belong to the certificate '", security.cert_file,
                          "': ", openssl_reason(none));
      }
    }
    tls_ = std::move(t);
  }
  if (!security.user.empty() && !security.tls)
    TROUPE_LOG(log_level::warn, "store", "etcd user '", security.user,
               "' signs in over plain http: its password crosses the network unencrypted; "
               "use https:// endpoints");
  security_ = std::move(security);
  return ok();
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
    if (!ec && tls_) {
      c->tls = std::make_unique<tls_stream>(c->stream, tls_->ctx);
      boost::system::error_code not_ip;
      asio::ip::make_address(ep.host, not_ip);
      if (not_ip)  // SNI carries names only
        SSL_set_tlsext_host_name(c->tls->native_handle(), ep.host.c_str());
      c->tls->set_verify_callback(asio::ssl::host_name_verification(ep.host));
      c->stream.expires_at(clamp(until));
      c->tls->async_handshake(asio::ssl::stream_base::client,
                              [&](const boost::system::error_code& e) { ec = e; });
      if (!c->run()) {
        leave(*c);
        return make_error(errc::shut_down,
                          "the etcd client was closed during the TLS handshake "
                          "with ",
                          ep.text());
      }
      if (ec && ec != beast::error::timeout) {
        leave(*c);
        std::string reason = openssl_reason(ec);
        return make_error(errc::unauthorized, "the TLS handshake with etcd at ", ep.text(),
                          " failed: ", reason, "; ", handshake_hint(reason, security_));
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

expected<std::string> etcd_http::auth_token(deadline until, bool renew) {
  if (security_.user.empty()) return std::string();
  std::lock_guard lock(auth_mu_);  // one sign-in at a time; the others wait for its token
  if (!token_.empty() && !renew) return token_;
  const std::string path = "/v3/auth/authenticate";
  json body = {{"name", security_.user}, {"password", security_.password}};
  auto reply = post_once(path, body.dump(), until, {.retry_safe = true}, std::string());
  if (!reply) {
    if (reply.error().code() == errc::invalid_argument ||
        reply.error().message().find("authentication failed") != std::string::npos)
      return make_error(errc::unauthorized, "etcd refused user '", security_.user,
                        "': ", reply.error().message(), "; check the user and its password file");
    return std::move(reply).error();
  }
  auto token = reply->value("token", std::string());
  if (token.empty())
    return make_error(errc::unauthorized, "etcd at ", describe(), " signed in user '",
                      security_.user, "' but gave no token (is authentication enabled there?)");
  token_ = std::move(token);
  return token_;
}

namespace {
// etcd forgets simple tokens after a while (and all of them when it restarts).
bool stale_token(const error& e) {
  return e.message().find("invalid auth token") != std::string::npos;
}
}  // namespace

expected<json> etcd_http::post(std::string_view path, const json& body, deadline until,
                               etcd_call options) {
  const std::string text = body.dump();
  auto token = auth_token(until, /*renew=*/false);
  if (!token) return std::move(token).error();
  auto reply = post_once(path, text, until, options, *token);
  if (!reply && !token->empty() && stale_token(reply.error())) {
    token = auth_token(until, /*renew=*/true);
    if (!token) return std::move(token).error();
    reply = post_once(path, text, until, options, *token);
  }
  return reply;
}

expected<json> etcd_http::post_once(std::string_view path, const std::string& text, deadline until,
                                    etcd_call options, const std::string& token) {
  for (int attempt = 0;; ++attempt) {
    auto acquired = acquire(until, options.ignore_cancel, /*fresh=*/attempt > 0);
    if (!acquired) return std::move(acquired).error();
    std::unique_ptr<etcd_connection> c = std::move(*acquired);
    active_guard guard{this, &c, [](etcd_http* h, etcd_connection& x) { h->leave(x); }};
    const etcd_endpoint& ep = endpoints_[c->endpoint];

    http::request<http::string_body> req{http::verb::post, std::string(path), 11};
    req.set(http::field::host, ep.text());
    req.set(http::field::content_type, "application/json");
    if (!token.empty()) req.set(http::field::authorization, token);
    req.keep_alive(true);
    req.body() = text;
    req.prepare_payload();

    boost::system::error_code ec;
    c->stream.expires_at(clamp(until));
    c->io([&](auto& s) { http::async_write(s, req, set_code{&ec}); });
    if (!c->run()) return cancelled_error(path);
    const bool may_retry = c->reused && options.retry_safe && attempt == 0;
    if (ec) {
      if (is_tls_error(ec)) return tls_error(ep, "sending", path, ec, security_);
      if (closed_after_handshake(*c, ec))
        return refused_after_handshake(ep, "sending", path, ec, security_);
      if (may_retry && ec != beast::error::timeout) continue;
      return io_error(ep, "sending", path, ec);
    }

    http::response_parser<http::string_body> parser;
    parser.body_limit(max_reply_bytes);
    c->io([&](auto& s) { http::async_read(s, c->buffer, parser, set_code{&ec}); });
    if (!c->run()) return cancelled_error(path);
    if (ec) {
      if (is_tls_error(ec)) return tls_error(ep, "reading the reply", path, ec, security_);
      if (!parser.got_some() && closed_after_handshake(*c, ec))
        return refused_after_handshake(ep, "reading the reply", path, ec, security_);
      if (may_retry && !parser.got_some() && ec != beast::error::timeout) continue;
      auto e = io_error(ep, "reading the reply", path, ec);
      if (auto hint = plain_close_hint(ec, tls_ != nullptr); !hint.empty() && !parser.got_some())
        return make_error(e.code(), e.message(), hint);
      return e;
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
    s.conn->io(
        [&](auto& io) { http::async_read_some(io, s.conn->buffer, s.parser, set_code{&ec}); });
    if (!s.conn->run()) return cancelled_error(s.path);
    auto& body = s.parser.get().body();
    s.pending += body;
    body.clear();
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::ssl::error::stream_truncated)
      return make_error(errc::connection_lost, "etcd at ", ep.text(), " closed the stream ",
                        s.path);
    if (ec) return io_error(ep, "reading the stream", s.path, ec);
  }
}

expected<std::unique_ptr<etcd_stream>> etcd_http::open_stream(std::string_view path,
                                                              const json& body, deadline until) {
  auto token = auth_token(until, /*renew=*/false);
  if (!token) return std::move(token).error();
  for (int attempt = 0;; ++attempt) {
    auto opened = open_stream_once(path, body, until, *token);
    if (opened || attempt > 0 || token->empty() || !stale_token(opened.error())) return opened;
    token = auth_token(until, /*renew=*/true);
    if (!token) return std::move(token).error();
  }
}

expected<std::unique_ptr<etcd_stream>> etcd_http::open_stream_once(std::string_view path,
                                                                   const json& body, deadline until,
                                                                   const std::string& token) {
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
  if (!token.empty()) req.set(http::field::authorization, token);
  req.body() = body.dump();
  req.prepare_payload();

  boost::system::error_code ec;
  c.stream.expires_at(clamp(until));
  c.io([&](auto& io) { http::async_write(io, req, set_code{&ec}); });
  if (!c.run()) return cancelled_error(path);
  if (ec && is_tls_error(ec)) return tls_error(ep, "sending", path, ec, security_);
  if (ec && closed_after_handshake(c, ec))
    return refused_after_handshake(ep, "sending", path, ec, security_);
  if (ec) return io_error(ep, "sending", path, ec);
  c.io([&](auto& io) { http::async_read_header(io, c.buffer, st.parser, set_code{&ec}); });
  if (!c.run()) return cancelled_error(path);
  if (ec && is_tls_error(ec)) return tls_error(ep, "reading the reply header", path, ec, security_);
  if (ec && !st.parser.got_some() && closed_after_handshake(c, ec))
    return refused_after_handshake(ep, "reading the reply header", path, ec, security_);
  if (ec) return io_error(ep, "reading the reply header", path, ec);
  const unsigned status = st.parser.get().result_int();
  if (status != 200) {
    c.io([&](auto& io) { http::async_read(io, c.buffer, st.parser, set_code{&ec}); });
    if (!c.run()) return cancelled_error(path);
    return reply_error(ep, path, status, st.parser.get().body());
  }
  return stream;
}

}  // namespace troupe::detail
