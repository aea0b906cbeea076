// The environment a worker starts with: who it is in the world, where rank 0 listens,
// which store to use, and which attempt this is. torchrun's names are set too, so that
// programs and tools written for torchrun run unchanged.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace troupe::launcher {

/// One worker's place in one round.
struct worker_assignment {
  int local_rank = 0;
  int rank = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int role_world_size = 1;
  std::string role = "default";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// This node's address as the other nodes reach it (TROUPE_LOCAL_ADDR).
  std::string local_addr = "127.0.0.1";
  /// TROUPE_SOCKET_IFNAME as troupe-run saw it (empty: unset): NCCL_SOCKET_IFNAME and
  /// GLOO_SOCKET_IFNAME follow it unless troupe-run's own environment sets them.
  std::string socket_ifname;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  /// The rendezvous round (0, 1, ...) that formed this world.
  long round = 0;
  /// Store for the workers (empty: none is offered), and the key prefix reserved for them.
  std::string store_url;
  std::string store_prefix;
  /// The job's secret (TROUPE_JOB_SECRET; empty: not set).
  std::string secret;
  /// --failure-policy replace: TROUPE_ELASTIC=1.
  bool elastic = false;
};

using env_list = std::vector<std::pair<std::string, std::string>>;

/// The variables troupe-run sets for this worker (not including the inherited ones).
/// OMP_NUM_THREADS=1 is added when `limit_omp_threads` is true; NCCL_SOCKET_IFNAME and
/// GLOO_SOCKET_IFNAME when a.socket_ifname is set and the launcher's environment does not
/// set them.
env_list worker_environment(const worker_assignment& a, bool limit_omp_threads);

/// `base` ("K=V" strings, e.g. environ) with `overrides` replacing or adding variables;
/// the result is ready for execve.
std::vector<std::string> merged_environment(const char* const* base, const env_list& overrides);

/// Whether OMP_NUM_THREADS should be pinned to 1: several workers on this node and the
/// launcher's own environment does not set it.
bool should_limit_omp_threads(int local_world_size);

}  // namespace troupe::launcher
