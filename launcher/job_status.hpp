// What troupe-run tells about its job: the run, the round, each worker of this node. The
// agent fills it; the metrics server serves it as JSON (GET /status) and renders its own
// metrics from it; `troupe-run status` reads the JSON back and prints a table.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <troupe/core/expected.hpp>

namespace troupe::launcher {

/// One worker of this node in the current attempt.
struct worker_status {
  int rank = 0;
  int local_rank = 0;
  long pid = 0;
  /// "running", "succeeded", "failed (exit code 3)", "failed (signal 9 (SIGKILL))", "stopped".
  std::string state;
  /// Restarts of the node's workers so far (TROUPE_RESTART_COUNT of this worker).
  int restarts = 0;
  /// The folder holding its stdout, stderr and error.json.
  std::string log_dir;
  /// Where it writes its metrics snapshot (TROUPE_METRICS_FILE); empty: none.
  std::string metrics_file;
};

/// The node's view of its job.
struct job_status {
  std::string run_id;
  /// This node's host name and address.
  std::string host;
  std::string address;
  /// The rendezvous round of the current attempt (-1 before the first).
  long round = -1;
  /// attempt_<n> of the logs: every start of this node's workers.
  int attempt = 0;
  int restarts = 0;
  int max_restarts = 0;
  /// Rounds this node took part in so far.
  long rounds = 0;
  int world_size = 0;
  /// Nodes in the current round.
  int nodes = 0;
  /// "rendezvous", "running", "restarting", "finished", "failed", "stopping".
  std::string state = "starting";
  std::vector<worker_status> workers;

  /// Workers in state "running".
  int running() const;
};

/// The JSON object GET /status returns (docs/metrics.md lists its fields).
std::string status_json(const job_status& s);
/// Reads status_json's output; errc::protocol_error saying what is missing otherwise.
expected<job_status> parse_status_json(std::string_view text);
/// A few summary lines, then one row per worker, columns aligned.
std::string status_table(const job_status& s);

}  // namespace troupe::launcher
