// etcd_server: a real etcd for tests, on 127.0.0.1 with free ports and a temporary data
// directory, stopped (SIGTERM, then SIGKILL) and cleaned up on destruction.
//
// Tests that need one call etcd_server::shared(), which starts a single etcd per test
// executable on first use; each test then uses its own key prefix. When the etcd binary
// is missing, shared() returns nullptr and skip_reason() says how to install it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include "support/child_process.hpp"

namespace troupe::test {

/// How a test etcd serves its clients.
struct etcd_server_options {
  /// Serve https with this certificate and key (PEM); empty: plain http.
  std::string cert_file;
  std::string key_file;
  /// With a certificate: require client certificates signed by this CA.
  std::string client_ca_file;
};

class etcd_server {
 public:
  /// The etcd binary: $TROUPE_ETCD_BINARY if set, else /usr/bin/etcd.
  static std::string binary();
  /// Whether binary() exists and is executable.
  static bool available();
  /// Why etcd tests are skipped when !available().
  static std::string skip_reason();

  /// Starts a fresh etcd and waits (at most `timeout`) until it answers.
  static expected<std::unique_ptr<etcd_server>> start(duration timeout = std::chrono::seconds(30));
  static expected<std::unique_ptr<etcd_server>> start(const etcd_server_options& options,
                                                      duration timeout = std::chrono::seconds(30));

  /// The etcd shared by the tests of this executable, started on first use; nullptr
  /// when etcd is not installed. A failure to start is fatal (throws).
  static etcd_server* shared();

  ~etcd_server();
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;

  /// "127.0.0.1:<client port>".
  std::string endpoint() const;
  /// "http://127.0.0.1:<client port>", or https:// when it serves TLS.
  std::string url() const;
  bool tls() const noexcept { return tls_; }

  /// Runs etcdctl against this etcd with `args` (e.g. {"user", "add", "root:pw"}); a
  /// non-zero exit is an error quoting its output.
  expected<std::string> etcdctl(const std::vector<std::string>& args) const;
  std::uint16_t client_port() const noexcept { return client_port_; }
  /// etcd's pid, or -1 when it is not running.
  pid_t pid() const noexcept { return proc_.pid(); }
  /// Whether it was started and has not been stopped or seen to exit.
  bool running() const noexcept { return proc_.started(); }

  /// Stops etcd: SIGTERM, then SIGKILL if it has not exited after 5 s. Idempotent.
  void stop();
  /// Starts a stopped etcd again on the same ports and data (its keys survive), waiting
  /// at most `timeout` until it answers. Does nothing when it is running.
  expected<void> restart(duration timeout = std::chrono::seconds(30));

 private:
  etcd_server() = default;
  // Runs etcd with args_ and waits until it answers; a port clash is errc::unavailable
  // with "address already in use" in the message.
  expected<void> launch(deadline until);

  std::vector<std::string> args_;
  child_process proc_;  // default (not started) while etcd is stopped
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  std::uint16_t metrics_port_ = 0;  // plain-http /health, also when clients get TLS
  bool tls_ = false;
  std::string data_dir_;
  std::string log_path_;
};

/// A key prefix unique to this process and call, e.g. "/test/1234-7/".
std::string unique_etcd_prefix(std::string_view name);

}  // namespace troupe::test
