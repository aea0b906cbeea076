// troupe-run's HTTP endpoint (--metrics-port): GET /metrics in Prometheus' text format
// (the node's workers' snapshots, labelled by rank, and troupe-run's own metrics) and
// GET /status as JSON (launcher/job_status.hpp). Boost.Beast on one thread of its own.
//
// Bounded: a request's header may be 8 KiB and its body 1 KiB; a connection gets 5 s to
// send its request and take the answer, then it is closed; at most 32 connections are
// open at once (more are closed at accept). A slow or stuck client never reaches the
// agent's loop, which only publishes a copy of its status (publish()).
#pragma once

#include <memory>
#include <string>

#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/launcher/job_status.hpp>

namespace troupe::launcher {

class metrics_server {
 public:
  /// Listens on `host`:`port` (0: a free port) and starts serving. errc::unavailable when
  /// the port is taken (the message names it and says what to do), errc::invalid_argument
  /// for an address that is not this host's.
  static expected<std::unique_ptr<metrics_server>> start(const std::string& host, int port);

  /// Stops serving and joins the server's thread (bounded by the connection timeout).
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// The port it listens on.
  int port() const noexcept;
  /// "http://host:port".
  std::string url() const;

  /// Replaces the status that /status serves and /metrics renders. Thread-safe, never
  /// blocks on a client.
  void publish(job_status status);

  /// The server's state, private to metrics_server.cpp.
  struct impl;

 private:
  explicit metrics_server(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

/// The Prometheus text of troupe-run's own metrics and of every worker of `status` whose
/// snapshot file can be read (a missing or malformed file is skipped).
std::string render_metrics(const job_status& status);

/// `troupe-run status ENDPOINT`: GETs ENDPOINT's /status ("host:port" or "http://host:port")
/// within `timeout` and returns the table to print; errc::unavailable when nothing answers,
/// errc::invalid_argument for an endpoint that is not host:port.
expected<std::string> fetch_status_table(const std::string& endpoint, duration timeout);

}  // namespace troupe::launcher
