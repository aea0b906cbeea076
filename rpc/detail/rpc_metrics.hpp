// The RPC agent's metrics (docs/metrics.md), looked up once per process.
#pragma once

#include <troupe/core/metrics.hpp>

namespace troupe::rpc::detail {

struct rpc_metrics {
  metrics::counter& client_calls = metrics::get_counter(
      "troupe_rpc_client_calls_total",
      "RPC calls (and remote-reference fetches) this worker sent that expect a reply");
  metrics::counter& client_errors =
      metrics::get_counter("troupe_rpc_client_errors_total",
                           "RPC calls this worker sent that ended in an error or timeout");
  metrics::histogram& client_latency = metrics::get_histogram(
      "troupe_rpc_client_latency_seconds", "time from sending an RPC call to its reply or error",
      metrics::latency_buckets());
  metrics::gauge& pending =
      metrics::get_gauge("troupe_rpc_pending_calls",
                         "RPC calls this worker sent that await their reply (queue depth)");
  metrics::gauge& send_queue = metrics::get_gauge(
      "troupe_rpc_send_queue_bytes",
      "bytes waiting in the send queues of this worker's RPC connections (sampled every 5 ms)");
  metrics::counter& server_calls =
      metrics::get_counter("troupe_rpc_server_calls_total", "RPC requests this worker received");
  metrics::counter& bytes_sent = metrics::get_counter(
      "troupe_rpc_sent_bytes_total", "bytes the RPC agent wrote to its connections");
  metrics::counter& bytes_received = metrics::get_counter(
      "troupe_rpc_received_bytes_total", "bytes the RPC agent read from its connections");
};

/// The process's RPC metrics.
inline rpc_metrics& rpc_stats() {
  static rpc_metrics m;
  return m;
}

}  // namespace troupe::rpc::detail
