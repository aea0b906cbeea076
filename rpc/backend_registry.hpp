// The RPC backend registry: backends by name, each a pair of handlers — one that builds
// its options from the common ones (rpc_timeout, init_method) plus backend-specific
// key/value settings, and one that initializes an agent. The built-in Asio TCP backend is
// registered as "tcp" (default_backend).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <troupe/core/expected.hpp>
#include <troupe/rpc/agent.hpp>
#include <troupe/rpc/options.hpp>

namespace troupe::rpc {

inline constexpr std::string_view default_backend = "tcp";

/// Backend-specific settings as text, e.g. {"num_worker_threads", "8"}.
using backend_settings = std::map<std::string, std::string>;

using construct_options_handler = std::function<expected<rpc_backend_options>(
    duration rpc_timeout, std::string init_method, const backend_settings& settings)>;
using init_backend_handler = std::function<expected<std::unique_ptr<agent>>(
    std::string name, int rank, std::optional<int> world_size, rpc_backend_options options)>;

/// Registers a backend. An empty name, a missing handler or a name already registered is
/// an error (already_exists names the backend).
expected<void> register_backend(std::string name, construct_options_handler construct,
                                init_backend_handler init);
bool backend_registered(std::string_view name);
/// Registered names, sorted.
std::vector<std::string> backend_names();

/// Runs the backend's options handler. Unknown backend: not_found listing the known ones.
expected<rpc_backend_options> construct_rpc_backend_options(std::string_view backend,
                                                            duration rpc_timeout,
                                                            std::string init_method,
                                                            const backend_settings& settings = {});

/// Starts an agent with `backend`: static group when `world_size` is given (this worker
/// is `rank`), dynamic group otherwise (rank ignored; an id is assigned on joining).
expected<std::unique_ptr<agent>> init_rpc(std::string name, int rank, std::optional<int> world_size,
                                          rpc_backend_options options,
                                          std::string_view backend = default_backend);

/// init_rpc from the job environment (troupe-run, torchrun, Slurm, or RANK/WORLD_SIZE/
/// MASTER_ADDR/MASTER_PORT; core/cluster_env.hpp): a static group named "<prefix><rank>"
/// unless `name` is given. Without options.init_method and options.store, the job's store
/// is opened as open_cluster_store() does (store/cluster_store.hpp: rank 0 hosts it when
/// the launcher does not). options.group is put under the attempt's scope
/// (cluster_env::store_scope), so a restarted worker never meets a dead attempt's records.
expected<std::unique_ptr<agent>> init_rpc_from_env(rpc_backend_options options,
                                                   std::string name = {},
                                                   std::string_view prefix = "worker",
                                                   std::string_view backend = default_backend);

}  // namespace troupe::rpc
