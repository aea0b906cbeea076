// The backend registry: collective backends keyed by name. "gloo" is always registered;
// "nccl" when the build has CUDA. Users may register their own.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/collectives/process_group.hpp>

namespace troupe::collectives {

struct backend_info {
  /// The key, e.g. "gloo".
  std::string name;
  /// One line for humans, e.g. "CPU tensors over Gloo's TCP transport".
  std::string description;
  /// Whether the backend can run on this machine (e.g. CUDA devices are present).
  std::function<bool()> viable;
  /// Builds a group; called on every member. Must be bounded by spec.timeout.
  std::function<expected<std::shared_ptr<process_group>>(const group_spec&)> create;
};

/// Adds a backend. A name registered before is errc::already_exists.
expected<void> register_backend(backend_info info);
/// The registered names, sorted.
std::vector<std::string> registered_backends();
/// The description of `name`, or not_found listing the known names.
expected<backend_info> find_backend(std::string_view name);

/// TROUPE_BACKEND when set, else "nccl" when CUDA devices are present and nccl is
/// registered, else "gloo".
std::string default_backend();

/// Builds a group through backend `name` ("" for default_backend()), then runs one small
/// allreduce across it to check every member arrived. Collective over spec's members.
expected<std::shared_ptr<process_group>> create_group(std::string_view name,
                                                      const group_spec& spec);

}  // namespace troupe::collectives
