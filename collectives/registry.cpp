#include <troupe/collectives/registry.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include <troupe/collectives/gloo/gloo_group.hpp>
#include <troupe/collectives/settings.hpp>
#include <troupe/core/cuda_runtime.hpp>
#include <troupe/core/log.hpp>
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
#include <troupe/collectives/nccl/nccl_group.hpp>
#endif

namespace troupe::collectives {

std::string describe(const process_group& g) {
  return strcat("group '", g.name(), "' (", g.backend_name(), ", rank ", g.rank(), " of ", g.size(),
                ")");
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

namespace {

struct registry {
  std::mutex mu;
  std::map<std::string, backend_info, std::less<>> backends;

  registry() {
    backends.emplace("gloo", gloo_backend_info());
#ifdef TROUPE_COLLECTIVES_HAVE_NCCL
    backends.emplace("nccl", nccl_backend_info());
#endif
  }
};

registry& the_registry() {
  static registry r;
  return r;
}

std::string known_names(const registry& r) {
  std::string s;
  for (const auto& [n, _] : r.backends) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

expected<void> register_backend(backend_info info) {
  if (info.name.empty() || !info.create)
    return make_error(errc::invalid_argument,
                      "a collective backend needs a name and a create function");
  auto& r = the_registry();
  std::lock_guard lk(r.mu);
  if (r.backends.contains(info.name))
    return make_error(errc::already_exists, "a collective backend named '", info.name,
                      "' is registered already; pick another name");
  std::string name = info.name;
  r.backends.emplace(std::move(name), std::move(info));
  return ok();
}

std::vector<std::string> registered_backends() {
  auto& r = the_registry();
  std::lock_guard lk(r.mu);
  std::vector<std::string> out;
  for (const auto& [n, _] : r.backends) out.push_back(n);
  return out;
}

expected<backend_info> find_backend(std::string_view name) {
  auto& r = the_registry();
  std::lock_guard lk(r.mu);
  auto it = r.backends.find(name);
  if (it == r.backends.end())
    return make_error(errc::not_found, "no collective backend named '", name,
                      "'; the registered ones are: ", known_names(r));
  return it->second;
}

std::string default_backend() {
  if (auto env = settings::backend.value()) return *env;
  auto n = cuda_device_count();
  if (n && *n > 0 && find_backend("nccl")) return "nccl";
  return "gloo";
}

expected<std::shared_ptr<process_group>> create_group(std::string_view name,
                                                      const group_spec& spec) {
  std::string chosen = name.empty() ? default_backend() : std::string(name);
  auto info = find_backend(chosen);
  if (!info) return std::move(info).error();
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    return make_error(errc::invalid_argument, "group '", spec.name, "': rank ", spec.rank,
                      " is not in [0, ", spec.size, ")");
  if (!spec.root_store)
    return make_error(errc::invalid_argument, "group '", spec.name, "' needs a store");
  if (!spec.global_ranks.empty() && spec.global_ranks.size() != static_cast<std::size_t>(spec.size))
    return make_error(errc::invalid_argument, "group '", spec.name, "' has ",
                      spec.global_ranks.size(), " global ranks for size ", spec.size);
  if (info->viable && !info->viable())
    return make_error(errc::unavailable, "collective backend '", chosen,
                      "' cannot run on this machine (", info->description,
                      "); set TROUPE_BACKEND or pass another backend name");
  group_spec s = spec;
  if (s.global_ranks.empty())
    for (int i = 0; i < s.size; ++i) s.global_ranks.push_back(i);
  TROUPE_LOG(log_level::info, "collectives", "creating group '", s.name, "' with backend ", chosen,
             " as rank ", s.rank, " of ", s.size);
  auto g = info->create(s);
  if (!g) return std::move(g).error().with_operation("collectives.create_group");
  return g;
}

}  // namespace troupe::collectives

namespace troupe::settings {

setting_list collectives_settings() {
  static constexpr const setting* list[] = {
      &backend,         &gloo_shm,  &gloo_shm_slot,     &gloo_shm_single_copy,  &gloo_local_sndbuf,
      &gloo_loop_batch, &gloo_host, &gloo_hierarchical, &gloo_hierarchical_min, &gloo_host_key,
      &local_rank};
  return list;
}

}  // namespace troupe::settings
