// etcd_http: the small HTTP/1.1 JSON client under etcd_store. It POSTs JSON to etcd's v3
// gateway (`/v3/...`) and reads either one JSON reply or a stream of JSON lines (watch).
// Internal to store/: not installed, and the only place that includes Boost.Beast.
//
// Over https every connection is TLS: etcd's certificate is checked against a CA and the
// endpoint's host, and a client certificate is shown when one is given (etcd's
// --client-cert-auth). With a user, the client signs in once (/v3/auth/authenticate) and
// sends the token with every request; a token etcd no longer knows is renewed once.
//
// Every call takes a deadline. A refused connection moves on to the next endpoint; when
// none answers the call fails with errc::connection_lost naming the endpoints tried. A
// non-200 reply becomes an error quoting etcd's message. Thread-safe: each call uses its
// own connection (idle keep-alive connections are pooled), so calls never wait on each
// other.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>

namespace troupe::detail {

using json = nlohmann::json;

/// One etcd client endpoint, e.g. "127.0.0.1:2379".
struct etcd_endpoint {
  std::string host;
  std::uint16_t port = 0;
  bool https = false;  // written as https://host:port
  std::string text() const;
};

/// Parses "host:port" (IPv6 as "[::1]:2379") with an optional "http://" or "https://".
expected<etcd_endpoint> parse_etcd_endpoint(std::string_view text);

/// How the client proves who it is and checks whom it talks to.
struct etcd_http_security {
  bool tls = false;
  std::string ca_file;    // PEM; empty: the system's trusted CAs
  std::string cert_file;  // PEM client certificate (with key_file), or empty
  std::string key_file;
  std::string user;  // empty: no etcd authentication
  std::string password;
};

/// Standard base64 (with padding), as the gateway encodes keys and values.
std::string base64_encode(std::string_view data);
expected<std::string> base64_decode(std::string_view text);

/// Reads an integer field that the gateway writes as a decimal string (int64 values are
/// strings in proto3 JSON); a missing field is 0, as proto3 omits zero values.
std::int64_t json_int(const json& object, std::string_view field);

class etcd_connection;
class etcd_http;

/// One open streaming reply (a watch): a sequence of JSON objects, one per line.
class etcd_stream {
 public:
  ~etcd_stream();
  etcd_stream(const etcd_stream&) = delete;
  etcd_stream& operator=(const etcd_stream&) = delete;

  /// The next JSON object, waiting until `until` passes (errc::timeout). The stream
  /// closing is errc::connection_lost; a cancelled client is errc::shut_down.
  expected<json> next(deadline until);

 private:
  friend class etcd_http;
  struct state;
  explicit etcd_stream(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

/// Per-call options of etcd_http::post.
struct etcd_call {
  /// Whether the request may be sent again when a pooled connection turns out to be
  /// broken before any reply byte arrived (true for reads and plain puts; false for
  /// requests whose reply depends on being applied exactly once).
  bool retry_safe = false;
  /// Runs even after cancel_all(): used for the final lease revoke.
  bool ignore_cancel = false;
};

class etcd_http {
 public:
  explicit etcd_http(std::vector<etcd_endpoint> endpoints);
  ~etcd_http();

  /// Sets TLS and authentication up before the first call. Fails with invalid_argument
  /// naming the file when a CA, certificate or key cannot be loaded, or when the
  /// certificate and key do not match.
  expected<void> secure(etcd_http_security security);
  etcd_http(const etcd_http&) = delete;
  etcd_http& operator=(const etcd_http&) = delete;

  /// POSTs `body` to `path` and returns the parsed JSON reply.
  expected<json> post(std::string_view path, const json& body, deadline until,
                      etcd_call options = {});

  /// POSTs `body` to `path` and returns the reply as a stream of JSON lines.
  expected<std::unique_ptr<etcd_stream>> open_stream(std::string_view path, const json& body,
                                                     deadline until);

  /// Makes every call in flight, and every later call not marked ignore_cancel, fail
  /// promptly with errc::shut_down. Idempotent.
  void cancel_all();

  /// "127.0.0.1:2379,127.0.0.1:22379" (with https:// in front over TLS).
  std::string describe() const;

 private:
  struct registration;
  struct tls_context;
  // The token to send (signing in when there is none yet); empty without a user.
  expected<std::string> auth_token(deadline until, bool renew);
  expected<json> post_once(std::string_view path, const std::string& text, deadline until,
                           etcd_call options, const std::string& token);
  expected<std::unique_ptr<etcd_stream>> open_stream_once(std::string_view path, const json& body,
                                                          deadline until, const std::string& token);
  friend class etcd_stream;
  expected<std::unique_ptr<etcd_connection>> acquire(deadline until, bool ignore_cancel,
                                                     bool fresh);
  void release(std::unique_ptr<etcd_connection> c);
  bool enter(etcd_connection& c, bool ignore_cancel);
  void leave(etcd_connection& c);

  std::vector<etcd_endpoint> endpoints_;
  std::atomic<std::size_t> preferred_{0};
  std::mutex mu_;
  bool cancelled_ = false;
  std::vector<std::unique_ptr<etcd_connection>> idle_;
  std::set<etcd_connection*> active_;
  etcd_http_security security_;
  std::unique_ptr<tls_context> tls_;
  std::mutex auth_mu_;
  std::string token_;
};

}  // namespace troupe::detail
