#include <troupe/rpc/backend_registry.hpp>

#include <charconv>
#include <mutex>

#include <troupe/core/cluster_env.hpp>
#include <troupe/core/metrics.hpp>
#include <troupe/store/cluster_store.hpp>

namespace troupe::rpc {

namespace {

struct backend_entry {
  construct_options_handler construct;
  init_backend_handler init;
};

expected<std::size_t> parse_count(const std::string& key, const std::string& text) {
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size())
    return make_error(errc::invalid_argument, "setting '", key,
                      "' must be a non-negative integer, got '", text, "'");
  return v;
}

expected<rpc_backend_options> tcp_construct(duration rpc_timeout, std::string init_method,
                                            const backend_settings& settings) {
  rpc_backend_options o;
  o.rpc_timeout = rpc_timeout;
  o.init_method = std::move(init_method);
  for (const auto& [k, v] : settings) {
    if (k == "num_worker_threads") {
      auto n = parse_count(k, v);
      if (!n) return std::move(n).error();
      o.num_worker_threads = *n;
    } else if (k == "num_io_threads") {
      auto n = parse_count(k, v);
      if (!n) return std::move(n).error();
      o.num_io_threads = *n;
    } else if (k == "busy_poll_us") {
      auto n = parse_count(k, v);
      if (!n) return std::move(n).error();
      o.busy_poll = std::chrono::microseconds(*n);
    } else if (k == "max_queued_bytes") {
      auto n = parse_count(k, v);
      if (!n) return std::move(n).error();
      o.max_queued_bytes = *n;
    } else if (k == "local_socket") {
      if (v != "0" && v != "1")
        return make_error(errc::invalid_argument, "setting 'local_socket' must be 0 or 1, got '", v,
                          "'");
      o.local_socket = v == "1";
    } else if (k == "tls_cert") {
      o.tls.cert = v;
    } else if (k == "tls_key") {
      o.tls.key = v;
    } else if (k == "tls_ca") {
      o.tls.ca = v;
    } else if (k == "job_token") {
      o.job_token = v;
    } else if (k == "listen_host") {
      o.listen_host = v;
    } else if (k == "group") {
      o.group = v;
    } else if (k == "devices") {
      // Comma-separated device names.
      std::size_t start = 0;
      while (start <= v.size() && !v.empty()) {
        auto end = v.find(',', start);
        auto d = device::parse(
            std::string_view(v).substr(start, end == std::string::npos ? v.npos : end - start));
        if (!d) return std::move(d).error();
        o.devices.push_back(*d);
        if (end == std::string::npos) break;
        start = end + 1;
      }
    } else {
      return make_error(errc::invalid_argument, "unknown setting '", k,
                        "' for the tcp backend; known: "
                        "num_worker_threads, num_io_threads, busy_poll_us, max_queued_bytes, "
                        "local_socket, tls_cert, tls_key, tls_ca, job_token, listen_host, "
                        "group, devices (device maps are set on the options object)");
    }
  }
  return o;
}

expected<std::unique_ptr<agent>> tcp_init(std::string name, int rank, std::optional<int> world_size,
                                          rpc_backend_options options) {
  auto core = detail::agent_core::create(std::move(name), rank, world_size, std::move(options));
  if (!core) return std::move(core).error();
  return std::make_unique<agent>(std::move(*core));
}

struct registry {
  std::mutex mu;
  std::map<std::string, backend_entry, std::less<>> entries;
  registry() {
    entries.emplace(std::string(default_backend), backend_entry{tcp_construct, tcp_init});
  }
};

registry& the_registry() {
  static registry r;
  return r;
}

expected<backend_entry> lookup(std::string_view name) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.entries.find(name);
  if (it != r.entries.end()) return it->second;
  std::string known;
  for (auto& [n, e] : r.entries) known += (known.empty() ? "" : ", ") + n;
  return make_error(errc::not_found, "no RPC backend called '", name, "' (registered: ", known,
                    "); register it with register_backend first");
}

}  // namespace

expected<void> register_backend(std::string name, construct_options_handler construct,
                                init_backend_handler init) {
  if (name.empty()) return make_error(errc::invalid_argument, "a backend needs a non-empty name");
  if (!construct || !init)
    return make_error(errc::invalid_argument, "backend '", name,
                      "' needs both an options handler and an init handler");
  auto& r = the_registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.entries.contains(name))
    return make_error(errc::already_exists, "RPC backend '", name, "' is already registered");
  r.entries.emplace(std::move(name), backend_entry{std::move(construct), std::move(init)});
  return ok();
}

bool backend_registered(std::string_view name) { return lookup(name).has_value(); }

std::vector<std::string> backend_names() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::vector<std::string> out;
  for (auto& [n, e] : r.entries) out.push_back(n);
  return out;
}

expected<rpc_backend_options> construct_rpc_backend_options(std::string_view backend,
                                                            duration rpc_timeout,
                                                            std::string init_method,
                                                            const backend_settings& settings) {
  auto e = lookup(backend);
  if (!e) return std::move(e).error();
  return e->construct(rpc_timeout, std::move(init_method), settings);
}

expected<std::unique_ptr<agent>> init_rpc(std::string name, int rank, std::optional<int> world_size,
                                          rpc_backend_options options, std::string_view backend) {
  auto e = lookup(backend);
  if (!e) return std::move(e).error();
  return e->init(std::move(name), rank, world_size, std::move(options));
}

expected<std::unique_ptr<agent>> init_rpc_from_env(rpc_backend_options options, std::string name,
                                                   std::string_view prefix,
                                                   std::string_view backend) {
  metrics::start_export_from_env();  // under troupe-run --metrics-port
  auto env = detect_cluster_env();
  if (!env) return std::move(env).error();
  if (options.init_method.empty() && !options.store) {
    // The launcher's store, or the one rank 0 hosts at MASTER_ADDR:MASTER_PORT (it lives
    // as long as the agent holds it).
    auto st = open_cluster_store(*env, options.init_timeout);
    if (!st) return std::move(st).error().with_operation("rpc init");
    options.store = std::move(st->base);
  }
  // This attempt's records only, whichever store: a restarted worker never reads a dead
  // attempt's.
  if (!env->store_scope.empty()) options.group = strcat(env->store_scope, "/", options.group);
  if (name.empty()) name = strcat(prefix, env->rank);
  return init_rpc(std::move(name), env->rank, env->world_size, std::move(options), backend);
}

}  // namespace troupe::rpc
