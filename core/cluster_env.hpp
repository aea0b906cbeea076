// cluster_env: where this process stands in its job, read from the environment that
// troupe-run, torchrun or Slurm's srun gives it, so that a troupe program initializes
// with no arguments under any of them.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include <troupe/core/expected.hpp>

namespace troupe {

/// Who started this process.
enum class cluster_kind {
  /// troupe-run (TROUPE_RUN_ID is set).
  troupe_run,
  /// torchrun / torch.distributed.elastic (TORCHELASTIC_RUN_ID is set).
  torchrun,
  /// Slurm's srun (SLURM_PROCID and SLURM_NTASKS are set).
  slurm,
  /// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by hand or another launcher.
  environment,
};

std::string_view to_string(cluster_kind kind) noexcept;

/// Where this process stands in its job, as detect_cluster_env() reads it.
struct cluster_env {
  /// Which launcher's variables were read.
  cluster_kind kind = cluster_kind::environment;
  /// This process's rank in the job (RANK, SLURM_PROCID).
  int rank = 0;
  /// How many processes the job has (WORLD_SIZE, SLURM_NTASKS).
  int world_size = 1;
  /// This process's rank on its node (LOCAL_RANK, SLURM_LOCALID).
  int local_rank = 0;
  /// How many of the job's processes run on this node (LOCAL_WORLD_SIZE).
  int local_world_size = 1;
  /// The node's rank among the job's nodes (GROUP_RANK, SLURM_NODEID).
  int node_rank = 0;
  /// The host and port of the job's rendezvous (MASTER_ADDR, MASTER_PORT; under Slurm
  /// the first node of the list and a port derived from the job id).
  std::string master_addr;
  /// See master_addr.
  int master_port = 0;
  /// The store every rank opens (connect_store). TROUPE_STORE_URL when set (troupe-run
  /// names its own store; under other launchers it may point at a troupe-store); else
  /// tcp://MASTER_ADDR:MASTER_PORT, hosted by rank 0 (MASTER_PORT + 1 when torchrun's
  /// agent holds MASTER_PORT itself: TORCHELASTIC_USE_AGENT_STORE=True).
  std::string store_url;
  /// Whether the store is the one rank 0 hosts at MASTER_ADDR (no launcher's store and no
  /// TROUPE_STORE_URL), and whether this process is that rank 0 and must host it.
  bool store_at_master = false;
  /// Whether this process must host the store (see store_at_master).
  bool host_store = false;
  /// The job's id (TROUPE_RUN_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID); may be empty.
  std::string run_id;
  /// Restarts of the job so far (TROUPE_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT,
  /// SLURM_RESTART_COUNT).
  int restart_count = 0;
  /// The key prefix that keeps this attempt's records apart from every other attempt's
  /// in the job's store, so that a restarted worker never reads a dead attempt's:
  /// TROUPE_STORE_PREFIX under troupe-run (one per rendezvous round), else
  /// "troupe-run/<run id>/round-<TROUPE_ROUND>"; "torchrun/<run id>/attempt-<restart
  /// count>" under torchrun; "slurm/<job id>/attempt-<SLURM_RESTART_COUNT>" under Slurm;
  /// empty with bare RANK/WORLD_SIZE variables, whose store rank 0 hosts anew each time.
  std::string store_scope;
};

/// Reads the environment of this process. errc::not_found when no launcher's variables
/// are present (the message lists what to set); errc::invalid_argument naming the
/// variable when one is malformed or inconsistent (a rank outside the world, say).
expected<cluster_env> detect_cluster_env();

/// The same, from an explicit set of variables (for tests and for callers that filter).
expected<cluster_env> detect_cluster_env(const std::map<std::string, std::string>& vars);

/// The first host of a Slurm host list: "node[01-04,07],gpu7" -> "node01".
expected<std::string> first_slurm_host(std::string_view nodelist);

}  // namespace troupe
