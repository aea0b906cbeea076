// cluster_store: the store of the job this process runs in, found from its launcher's
// environment (core/cluster_env.hpp) under troupe-run, torchrun, Slurm or bare
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT variables, and scoped to this attempt.
//
// Every store exchange the library makes from the environment (troupe::init,
// rpc::init_rpc_from_env) goes through open_cluster_store(), so that a restarted worker
// never reads the records of a dead attempt: the scoped store puts every key under
// cluster_env::store_scope.
#pragma once

#include <memory>
#include <string>

#include <troupe/core/cluster_env.hpp>
#include <troupe/core/time.hpp>
#include <troupe/store/store.hpp>

namespace troupe {

struct cluster_store {
  /// The job's store with every key under `scope` (the same object as `base` when the
  /// scope is empty). Groups, agents and barriers use this one.
  std::shared_ptr<store> scoped;
  /// The whole store, the launcher's own keys included.
  std::shared_ptr<store> base;
  /// Where it is ("tcp://host:port", "etcd://...", "memory://" for a world of one).
  std::string url;
  std::string scope;
  /// Whether this process hosts the server (rank 0 when the launcher hosts no store). The
  /// server lives as long as either pointer above.
  bool hosted = false;
};

/// Opens the job's store for `env`:
/// - the launcher's store (env.store_url), when it offers one;
/// - else, when env.host_store, this process (rank 0) hosts a server on the port of the
///   URL (bound to MASTER_ADDR when that is an address of this host, else to every
///   interface) and connects to it like everyone else;
/// - a fresh in-process store for a world of one with no store named.
/// Errors, each naming the setting: a host that does not resolve (at once), a loopback
/// MASTER_ADDR in a job whose ranks are not all on this host (at once; unless
/// TROUPE_LOCAL_ADDR is loopback too: several nodes simulated on one host), a port rank 0
/// cannot bind, and a store not reachable within `timeout` (errc::timeout: where it
/// looked, and who should host it).
expected<cluster_store> open_cluster_store(const cluster_env& env, duration timeout);

}  // namespace troupe
