#include <troupe/launcher/worker_env.hpp>

#include <cstdlib>
#include <set>
#include <string_view>

#include <troupe/core/settings.hpp>
#include <troupe/store/settings.hpp>

namespace troupe::launcher {

env_list worker_environment(const worker_assignment& a, bool limit_omp_threads) {
  auto s = [](auto v) { return std::to_string(v); };
  env_list e{
      {"RANK", s(a.rank)},
      {"LOCAL_RANK", s(a.local_rank)},
      {"GROUP_RANK", s(a.group_rank)},
      {"GROUP_WORLD_SIZE", s(a.group_world_size)},
      {"ROLE_RANK", s(a.role_rank)},
      {"ROLE_NAME", a.role},
      {"LOCAL_WORLD_SIZE", s(a.local_world_size)},
      {"WORLD_SIZE", s(a.world_size)},
      {"ROLE_WORLD_SIZE", s(a.role_world_size)},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", s(a.master_port)},
      {std::string(settings::local_addr.variable), a.local_addr},
      {std::string(settings::restart_count.variable), s(a.restart_count)},
      {std::string(settings::max_restarts.variable), s(a.max_restarts)},
      {std::string(settings::run_id.variable), a.run_id},
      {std::string(settings::rendezvous_round.variable), s(a.round)},
      {"TORCHELASTIC_RESTART_COUNT", s(a.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", s(a.max_restarts)},
      {"TORCHELASTIC_RUN_ID", a.run_id},
  };
  if (!a.store_url.empty()) {
    e.emplace_back(settings::store_url.variable, a.store_url);
    e.emplace_back(settings::store_prefix.variable, a.store_prefix);
  }
  if (!a.secret.empty()) e.emplace_back(settings::job_secret.variable, a.secret);
  if (a.elastic) e.emplace_back(settings::elastic.variable, "1");
  if (limit_omp_threads) e.emplace_back("OMP_NUM_THREADS", "1");
  // One interface named once: NCCL's and Gloo's own bootstrap follow it too, unless they
  // were told otherwise.
  if (!a.socket_ifname.empty())
    for (const char* name : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
      if (const char* set = std::getenv(name); set == nullptr || *set == '\0')
        e.emplace_back(name, a.socket_ifname);
  return e;
}

std::vector<std::string> merged_environment(const char* const* base, const env_list& overrides) {
  std::set<std::string, std::less<>> replaced;
  for (const auto& kv : overrides) replaced.insert(kv.first);
  std::vector<std::string> out;
  for (const char* const* p = base; p != nullptr && *p != nullptr; ++p) {
    std::string_view entry(*p);
    auto eq = entry.find('=');
    if (eq != std::string_view::npos && replaced.count(entry.substr(0, eq)) != 0) continue;
    // A variable troupe-run only sets sometimes must not leak in from the launcher's
    // own environment, or a worker would see a store of some other job.
    // Nor a secret other than the job's (the older name would otherwise be read when the
    // job has none), nor elastic mode from an enclosing job.
    if (eq != std::string_view::npos) {
      const std::string_view name = entry.substr(0, eq);
      if (name == settings::store_url.variable || name == settings::store_prefix.variable ||
          name == settings::job_secret.variable || name == settings::job_secret.fallback ||
          name == settings::elastic.variable)
        continue;
    }
    out.emplace_back(entry);
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

bool should_limit_omp_threads(int local_world_size) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  return local_world_size > 1 && (omp == nullptr || *omp == '\0');
}

}  // namespace troupe::launcher
