// troupe::init: one call that joins a program to its job from any launcher's environment
// (troupe-run, torchrun, Slurm's srun, or bare RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) and
// returns the world: rank and size, the job's store scoped to this attempt, the world
// process group, this process's address, and on request the RPC agent.
//
//   auto w = troupe::init().value();                 // or init({.rpc = true, ...})
//   w.group().allreduce(t).wait();
//   w.rpc()->rpc_sync<int>("worker1", "add", 2, 3);  // #include <troupe/rpc/agent.hpp>
//
// Contract:
// - Under every launcher, the store is the one the launcher offers, else the one rank 0
//   hosts at MASTER_ADDR:MASTER_PORT (store/cluster_store.hpp). Every key the library
//   writes through it is scoped by run id and attempt (cluster_env::store_scope): a
//   restarted worker never reads a dead attempt's records.
// - Every component binds this process's address for its job (core/net_address.hpp).
// - Every step is bounded by init_options::timeout (TROUPE_DEFAULT_TIMEOUT by default); a
//   store nobody hosts is an errc::timeout saying where init looked and who should host
//   it; bad settings (an interface that does not exist, a MASTER_ADDR that does not
//   resolve) fail at once, naming the setting.
// - Without any launcher's variables the program runs as a world of one (in-process
//   store) unless init_options::require_launcher says otherwise.
// - A world is a handle: copies share one job membership. shutdown() is idempotent and
//   bounded; the last handle's destruction calls it. The rank that hosts the store keeps it
//   up until every rank has shut down (or the timeout passes).
//
// Layering (docs/architecture.md): world/ sits above store/, collectives/ and rpc/; actors
// take a world in actors::node::make(), so init itself needs no CAF.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <troupe/collectives/elastic_group.hpp>
#include <troupe/collectives/process_group.hpp>
#include <troupe/core/cluster_env.hpp>
#include <troupe/core/expected.hpp>
#include <troupe/core/time.hpp>
#include <troupe/rpc/options.hpp>

namespace troupe {

class store;

namespace rpc {
class agent;
}

struct init_options {
  /// Bound on each step of init (store, world group, RPC agent) and on shutdown's wait.
  /// Zero: default_timeout() (TROUPE_DEFAULT_TIMEOUT, 5 minutes unless set).
  duration timeout = duration::zero();
  /// Collective backend of the world group ("gloo", "nccl"); empty: the default
  /// (collectives/registry.hpp default_backend(): TROUPE_BACKEND, else by device).
  std::string backend;
  /// Name of the world group (also its key prefix in the store).
  std::string group_name = "world";
  /// Start the RPC agent too: a static group of every rank (in an elastic world, a dynamic
  /// group that follows the epochs), this worker named "<rpc_name_prefix><rank>".
  /// rpc_options' store, init_method and init_timeout (and membership_tag when elastic) are
  /// set by init (the job's store, the timeout above); everything else is used as given.
  bool rpc = false;
  std::string rpc_name_prefix = "worker";
  rpc::rpc_backend_options rpc_options;
  /// Refuse to run without a launcher's variables (errc::not_found saying what to set)
  /// instead of running as a world of one.
  bool require_launcher = false;
  /// Follow the job's membership (docs/membership.md) instead of forming a fixed world:
  /// join it as "<rpc_name_prefix><RANK>" and build the world group per epoch
  /// (collectives::elastic_group, named group_name), so that ranks may die, be replaced
  /// and join while the others run on. Unset: on when TROUPE_ELASTIC=1 (troupe-run
  /// --failure-policy replace). Needs a store that outlives every worker (a launcher's,
  /// never one this process hosts). With `rpc` the agent is a dynamic group whose
  /// membership is the job's: it joins once the group of init's epoch is built, a worker
  /// an epoch takes out is expelled from it with that epoch's membership_changed error (so
  /// actor monitors fire with it too), and a broken RPC connection is reported to the
  /// membership, which decides (docs/membership.md, "Who follows the epochs").
  std::optional<bool> elastic;
};

class world {
 public:
  /// This process's place in the job. In an elastic world: its rank and the size of the
  /// epoch init built the group of (group() and elastic() say what holds now).
  int rank() const noexcept;
  int size() const noexcept;
  int local_rank() const noexcept;
  int local_size() const noexcept;
  /// Where the job came from (launcher, run id, restart count, store URL and scope).
  const cluster_env& env() const noexcept;
  /// The address this process binds and advertises (core/net_address.hpp).
  const std::string& address() const noexcept;
  /// The job's store, every key under this attempt's scope.
  const std::shared_ptr<troupe::store>& store() const noexcept;
  /// The world process group (all ranks). In an elastic world, the group of init's epoch:
  /// once the epoch moves on its work fails with membership_changed; elastic()->rebuild()
  /// gives the current one.
  collectives::process_group& group() const noexcept;
  const std::shared_ptr<collectives::process_group>& group_ptr() const noexcept;
  /// The job's membership and the world group that follows it; null unless elastic.
  const std::shared_ptr<troupe::membership::service>& membership() const noexcept;
  collectives::elastic_group* elastic() const noexcept;
  /// The RPC agent; null unless init_options::rpc was set. In an elastic world, a dynamic
  /// group that follows the epochs (see init_options::elastic).
  const std::shared_ptr<rpc::agent>& rpc() const noexcept;
  /// Whether this process hosts the job's store (rank 0 when no launcher does).
  bool hosts_store() const noexcept;

  /// Shuts the RPC agent down (a static group waits for every worker), then the group (an
  /// elastic world then leaves the membership); the rank hosting the store waits for every
  /// rank to get here before closing it.
  /// Idempotent; zero timeout: init's. The first error is returned (and again later).
  expected<void> shutdown(duration timeout = duration::zero());

  struct impl;
  explicit world(std::shared_ptr<impl> i);

 private:
  std::shared_ptr<impl> impl_;
};

/// Joins this process to its job (see the contract above).
expected<world> init(init_options options = {});

}  // namespace troupe
