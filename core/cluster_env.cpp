#include <troupe/core/cluster_env.hpp>
#include <troupe/core/settings.hpp>

#include <unistd.h>

#include <charconv>

#include <troupe/core/strcat.hpp>

extern char** environ;

namespace troupe {

namespace {

using vars_t = std::map<std::string, std::string>;

const std::string* find(const vars_t& v, std::string_view name) {
  auto it = v.find(std::string(name));
  return it == v.end() || it->second.empty() ? nullptr : &it->second;
}

expected<int> integer(const vars_t& v, std::string_view name, int min, int max) {
  const std::string* text = find(v, name);
  if (!text) return make_error(errc::not_found, name, " is not set");
  int n = 0;
  auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), n);
  if (ec != std::errc() || ptr != text->data() + text->size() || n < min || n > max)
    return make_error(errc::invalid_argument, name, "='", *text, "' is not a whole number from ",
                      min, " to ", max, "; fix the launcher's environment");
  return n;
}

// An optional integer: `fallback` when unset, an error when set but malformed.
expected<int> integer_or(const vars_t& v, std::string_view name, int min, int max, int fallback) {
  if (!find(v, name)) return fallback;
  return integer(v, name, min, max);
}

constexpr int max_ranks = 1 << 24;

expected<void> check_consistent(const cluster_env& e) {
  if (e.rank >= e.world_size)
    return make_error(errc::invalid_argument, "rank ", e.rank, " is outside a world of ",
                      e.world_size, " (", to_string(e.kind),
                      " environment); check RANK and "
                      "WORLD_SIZE (or SLURM_PROCID and SLURM_NTASKS)");
  if (e.local_rank >= e.local_world_size)
    return make_error(errc::invalid_argument, "local rank ", e.local_rank, " is outside a node of ",
                      e.local_world_size, " processes (", to_string(e.kind), " environment)");
  return ok();
}

expected<cluster_env> from_rank_variables(const vars_t& v, cluster_kind kind) {
  cluster_env e;
  e.kind = kind;
  auto world = integer(v, "WORLD_SIZE", 1, max_ranks);
  if (!world) return std::move(world).error();
  e.world_size = *world;
  auto rank = integer(v, "RANK", 0, max_ranks);
  if (!rank) return std::move(rank).error();
  e.rank = *rank;
  auto local_world = integer_or(v, "LOCAL_WORLD_SIZE", 1, max_ranks, e.world_size);
  if (!local_world) return std::move(local_world).error();
  e.local_world_size = *local_world;
  auto local_rank = integer_or(v, "LOCAL_RANK", 0, max_ranks, e.rank % e.local_world_size);
  if (!local_rank) return std::move(local_rank).error();
  e.local_rank = *local_rank;
  auto node = integer_or(v, "GROUP_RANK", 0, max_ranks, 0);
  if (!node) return std::move(node).error();
  e.node_rank = *node;
  if (const auto* a = find(v, "MASTER_ADDR")) e.master_addr = *a;
  auto port = integer_or(v, "MASTER_PORT", 1, 65535, 0);
  if (!port) return std::move(port).error();
  e.master_port = *port;
  return e;
}

}  // namespace

std::string_view to_string(cluster_kind kind) noexcept {
  switch (kind) {
    case cluster_kind::troupe_run:
      return "troupe-run";
    case cluster_kind::torchrun:
      return "torchrun";
    case cluster_kind::slurm:
      return "Slurm";
    case cluster_kind::environment:
      return "RANK/WORLD_SIZE";
  }
  return "unknown";
}

expected<std::string> first_slurm_host(std::string_view list) {
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument, "cannot read the Slurm host list '", list, "': ", why,
                      "; set MASTER_ADDR to the first node's address");
  };
  // The first entry ends at a ',' outside brackets.
  std::size_t end = 0;
  int depth = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']') --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  std::string_view first = list.substr(0, end);
  if (first.empty()) return bad("it is empty");
  auto open = first.find('[');
  if (open == std::string_view::npos) return std::string(first);
  auto close = first.find(']', open);
  if (close == std::string_view::npos) return bad("a '[' is not closed");
  std::string_view ranges = first.substr(open + 1, close - open - 1);
  std::string_view lo = ranges.substr(0, std::min(ranges.find(','), ranges.find('-')));
  if (lo.empty()) return bad("an empty range");
  for (char c : lo)
    if (c < '0' || c > '9') return bad("a range that is not numeric");
  return std::string(first.substr(0, open)) + std::string(lo) +
         std::string(first.substr(close + 1));
}

expected<cluster_env> detect_cluster_env(const vars_t& v) {
  expected<cluster_env> e = make_error(errc::not_found, "");
  if (find(v, settings::run_id.variable)) {
    e = from_rank_variables(v, cluster_kind::troupe_run);
    if (!e) return std::move(e).error();
    e->run_id = *find(v, settings::run_id.variable);
    auto restarts = integer_or(v, settings::restart_count.variable, 0, 1 << 30, 0);
    if (!restarts) return std::move(restarts).error();
    e->restart_count = *restarts;
    if (const auto* prefix = find(v, settings::store_prefix.variable)) {
      e->store_scope = *prefix;
    } else {
      auto round = integer_or(v, settings::rendezvous_round.variable, 0, 1 << 30, 0);
      if (!round) return std::move(round).error();
      e->store_scope = strcat("troupe-run/", e->run_id, "/round-", *round);
    }
  } else if (find(v, "TORCHELASTIC_RUN_ID") || (find(v, "RANK") && find(v, "WORLD_SIZE"))) {
    bool elastic = find(v, "TORCHELASTIC_RUN_ID") != nullptr;
    e = from_rank_variables(v, elastic ? cluster_kind::torchrun : cluster_kind::environment);
    if (!e) return std::move(e).error();
    if (elastic) {
      e->run_id = *find(v, "TORCHELASTIC_RUN_ID");
      auto restarts = integer_or(v, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, 0);
      if (!restarts) return std::move(restarts).error();
      e->restart_count = *restarts;
      e->store_scope = strcat("torchrun/", e->run_id, "/attempt-", e->restart_count);
    }
  } else if (find(v, "SLURM_PROCID") && find(v, "SLURM_NTASKS")) {
    cluster_env s;
    s.kind = cluster_kind::slurm;
    auto rank = integer(v, "SLURM_PROCID", 0, max_ranks);
    if (!rank) return std::move(rank).error();
    auto world = integer(v, "SLURM_NTASKS", 1, max_ranks);
    if (!world) return std::move(world).error();
    auto local = integer_or(v, "SLURM_LOCALID", 0, max_ranks, 0);
    if (!local) return std::move(local).error();
    auto node = integer_or(v, "SLURM_NODEID", 0, max_ranks, 0);
    if (!node) return std::move(node).error();
    auto nodes = integer_or(v, "SLURM_NNODES", 1, max_ranks, 1);
    if (!nodes) return std::move(nodes).error();
    s.rank = *rank;
    s.world_size = *world;
    s.local_rank = *local;
    s.node_rank = *node;
    // Tasks per node: SLURM_NTASKS_PER_NODE when given, else an even split.
    auto per_node =
        integer_or(v, "SLURM_NTASKS_PER_NODE", 1, max_ranks, (*world + *nodes - 1) / *nodes);
    if (!per_node) return std::move(per_node).error();
    s.local_world_size = *per_node;
    if (const auto* a = find(v, "MASTER_ADDR")) {
      s.master_addr = *a;
    } else {
      const auto* list = find(v, "SLURM_STEP_NODELIST");
      if (!list) list = find(v, "SLURM_JOB_NODELIST");
      if (!list)
        return make_error(errc::not_found,
                          "Slurm gave no node list (SLURM_STEP_NODELIST or "
                          "SLURM_JOB_NODELIST); set MASTER_ADDR");
      auto host = first_slurm_host(*list);
      if (!host) return std::move(host).error();
      s.master_addr = *host;
    }
    // Slurm assigns no port: MASTER_PORT, else one derived from the job id so that every
    // task of the job picks the same one.
    auto job = integer_or(v, "SLURM_JOB_ID", 0, 1 << 30, 0);
    if (!job) return std::move(job).error();
    auto port = integer_or(v, "MASTER_PORT", 1, 65535, 20000 + *job % 20000);
    if (!port) return std::move(port).error();
    s.master_port = *port;
    if (const auto* id = find(v, "SLURM_JOB_ID")) s.run_id = *id;
    auto requeues = integer_or(v, "SLURM_RESTART_COUNT", 0, 1 << 30, 0);
    if (!requeues) return std::move(requeues).error();
    s.restart_count = *requeues;
    s.store_scope = strcat("slurm/", s.run_id.empty() ? std::string("job") : s.run_id, "/attempt-",
                           s.restart_count);
    e = std::move(s);
  } else {
    return make_error(errc::not_found,
                      "no launcher environment found; start the program with troupe-run, "
                      "torchrun or srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  }
  TROUPE_TRY(check_consistent(*e));
  // A store named by hand wins under any launcher (troupe-run sets it itself).
  if (const auto* url = find(v, settings::store_url.variable)) e->store_url = *url;
  if (e->store_url.empty()) {
    if (e->world_size > 1 && (e->master_addr.empty() || e->master_port == 0))
      return make_error(errc::not_found, "the ", to_string(e->kind),
                        " environment gives no store: set MASTER_ADDR and MASTER_PORT (rank 0 "
                        "hosts the store there)");
    if (!e->master_addr.empty() && e->master_port != 0) {
      // torchrun's own agent may listen on MASTER_PORT (its c10d store, which troupe does
      // not speak): troupe's store then goes on the next port.
      int port = e->master_port;
      if (const auto* agent = find(v, "TORCHELASTIC_USE_AGENT_STORE");
          agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
        if (port == 65535)
          return make_error(errc::invalid_argument,
                            "MASTER_PORT=65535 is held by torchrun's agent store and troupe's "
                            "store takes the next port; choose a lower --master-port, or set "
                            "TROUPE_STORE_URL");
        ++port;
      }
      e->store_url = "tcp://" + e->master_addr + ":" + std::to_string(port);
      e->store_at_master = true;
      e->host_store = e->rank == 0;
    }
  }
  return e;
}

expected<cluster_env> detect_cluster_env() {
  vars_t vars;
  for (char** p = environ; p && *p; ++p) {
    std::string_view entry(*p);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return detect_cluster_env(vars);
}

}  // namespace troupe
